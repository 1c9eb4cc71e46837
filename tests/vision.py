"""The vision model pair for tests, written once per machine, and images to show it.

- `vision_model_dir(projector="idefics3")`: a folder holding `model.gguf` (SmolLM2-135M-Instruct
  with SmolVLM's and Gemma 3's image tokens) and `mmproj.gguf` (a random-weight projector,
  SmolVLM's `idefics3` or Gemma 3's `gemma3`), written by bench/vision_model.py into
  CACHE/vision-model/<projector>-<hash of the script and source model> the first time (a few
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

import hashlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.models import CACHE

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "vision_model.py"
MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"


def _script() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import bench.vision_model

    return bench.vision_model


def _key(projector: str) -> str:
    """The projector, the script's bytes and the source model's name and size: what the
    files depend on."""
    from app.config import default_model_path

    src = default_model_path()
    digest = hashlib.sha256(SCRIPT.read_bytes())
    digest.update(f"{src.name}:{src.stat().st_size}".encode())
    return f"{projector}-{digest.hexdigest()[:16]}"


def vision_model_dir(projector: str = "idefics3") -> Path:
    """The folder with model.gguf and mmproj.gguf, written the first time on this machine.
    Parallel test processes each write into a temporary folder and the first rename wins."""
    target = CACHE / "vision-model" / _key(projector)
    if (target / MODEL_FILE).is_file() and (target / MMPROJ_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".writing-"))
    try:
        script = _script()
        script.write(tmp, projector=script.Projector(kind=projector))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MMPROJ_FILE).is_file():  # not another writer's whole pair
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


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
