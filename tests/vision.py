"""The vision model pair for tests, written once per machine, and images to show it.

- `vision_model_dir(projector="idefics3")`: a folder holding `model.gguf` (SmolLM2-135M-Instruct
  with SmolVLM's and Gemma 3's image tokens) and `mmproj.gguf` (a random-weight projector,
  SmolVLM's `idefics3` or Gemma 3's `gemma3`), written by harness/vision_model.py into
  CACHE/vision-model/<projector>-<hash of the writer and source model> the first time (a few
  seconds), reused after. With `qwen2vl` the text model is the same SmolLM2 as Qwen2-VL's
  architecture (M-RoPE) with `<|vision_start|>` and `<|vision_end|>`, and the projector
  Qwen2-VL's;
- `vision_model`, `gemma3_vision_model`, `qwen2vl_vision_model`: the same as session-scoped
  pytest fixtures (import them into a test module or a conftest.py);
- `png(...)`: a small PNG of a given colour, optionally striped, made with Pillow.

With `idefics3` an image costs the model 32 positions (one 128x128 tile and the overview, 16
embeddings each) and a few framing tokens; with `gemma3`, 16 positions between
`<start_of_image>` and `<end_of_image>`; with `qwen2vl`, a 160x96 image is 5x3 = 15 embeddings
in 5 M-RoPE positions (libmtmd's `mtmd_decode_use_mrope`) between `<|vision_start|>` and
`<|vision_end|>`.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from harness.vision_model import MMPROJ_FILE, MODEL_FILE, Projector, written_pair
from tests.models import CACHE

__all__ = [
    "MMPROJ_FILE", "MODEL_FILE", "gemma3_vision_model", "png", "qwen2vl_vision_model",
    "vision_model", "vision_model_dir",
]  # fmt: skip


def vision_model_dir(projector: str = "idefics3") -> Path:
    """The folder with model.gguf and mmproj.gguf, written the first time on this machine."""
    return written_pair(CACHE / "vision-model", Projector(kind=projector))


@pytest.fixture(scope="session")
def vision_model() -> Path:
    """The SmolVLM-shaped pair's folder (`/ "model.gguf"`, `/ "mmproj.gguf"`)."""
    return vision_model_dir("idefics3")


@pytest.fixture(scope="session")
def gemma3_vision_model() -> Path:
    """The same text model with a Gemma 3 projector."""
    return vision_model_dir("gemma3")


@pytest.fixture(scope="session")
def qwen2vl_vision_model() -> Path:
    """SmolLM2 as Qwen2-VL's text model (M-RoPE) with a Qwen2-VL projector."""
    return vision_model_dir("qwen2vl")


def png(color: tuple[int, int, int], size: tuple[int, int] = (160, 96), stripes: int = 0) -> bytes:
    """A PNG of `size` (width, height) in `color`, with a white line every `stripes` rows."""
    from PIL import Image

    image = Image.new("RGB", size, color)
    if stripes:
        for y in range(0, size[1], stripes):
            for x in range(size[0]):
                image.putpixel((x, y), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()
