"""The thinking models for tests, written once per machine (harness/reasoning_model.py).

- `reasoning_models_dir()`: a folder holding `think.gguf` (Qwen3's `<think>` format),
  `opened.gguf` (DeepSeek-R1's: the template opens the thought) and `channels.gguf`
  (gpt-oss's harmony channels), each the embedded SmolLM2 with its format's tokens, chat
  template and a small circuit that writes the tags, written into
  CACHE/reasoning-models/<hash of the writer and source model> the first time (about 8 s
  on 2 cores: one read of SmolLM2, three 125 MB files), reused after;
- the session fixture `reasoning_models` (tests/conftest.py): {format: path}.

`batchyard serve --models-dir "$(reasoning_models_dir())" --no-discover` serves them as
models `think`, `opened` and `channels`. Greedy, they think and answer (bench/README.md
gives each recipe and llama-server's answers, with batchyard's default KV cache).
"""

from __future__ import annotations

from pathlib import Path

from harness.reasoning_model import FORMATS, written_all
from tests.models import CACHE

__all__ = ["FORMATS", "reasoning_model_paths", "reasoning_models_dir"]


def reasoning_model_paths() -> dict[str, Path]:
    """Each format's model file, written the first time on this machine."""
    return written_all(CACHE / "reasoning-models")


def reasoning_models_dir() -> Path:
    """The folder of the three models: a `--models-dir` for batchyard."""
    return next(iter(reasoning_model_paths().values())).parent
