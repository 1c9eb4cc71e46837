"""Loading a model into a LlamaEngine: the model's llama.cpp contexts (native.py), its
projector where it has one (vision.py), and what the load took (memory, seconds).

The pool (engine/pool/) loads each catalog entry through `load_engine`; a lone engine (a
test's, `--model` without a catalog) gets the server's own settings.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc

from app.config import AUTO_GPU_LAYERS, Settings
from app.engine.llama import native, vision
from app.engine.llama.engine import LlamaEngine
from app.engine.llama.slots import BATCH_PROMPT_TOKENS_PER_STEP

if TYPE_CHECKING:
    from app.catalog import Entry

log = logging.getLogger("batchyard.engine")


def load_engine(
    settings: Settings, entry: Entry | None = None, *, projector: Path | None = None
) -> LlamaEngine:
    """Load the configured model (or a catalog entry with its load profile) and start its
    owner thread. The engine says what the load took: `measured_bytes`, `load_seconds`.

    A multimodal projector (`projector`, or the entry's) loads with the model, and the
    engine then takes images in chat and responses bodies (`info.takes_images`)."""
    if projector is None and entry is not None:
        projector = getattr(entry, "projector", None)
    if entry is not None:
        settings = entry_settings(settings, entry)
    if settings.n_gpu_layers == AUTO_GPU_LAYERS:
        # Without the pool's estimate of each layer (an engine loaded alone): every layer
        # on a GPU there is one, none without.
        on_gpu = lc.llama_supports_gpu_offload() and native.gpu_backend_name() is not None
        settings = dataclasses.replace(settings, n_gpu_layers=-1 if on_gpu else 0)
    before, t = native.memory_in_use(), time.monotonic()
    model = native.load(settings, prompt_tokens_per_step=BATCH_PROMPT_TOKENS_PER_STEP)
    eyes, eyes_bytes, eyes_error = None, None, None
    if projector is not None:
        at = native.memory_in_use()
        try:
            on_gpu = settings.n_gpu_layers != 0 and model.gpu_backend is not None
            eyes = vision.Projector(
                Path(projector), model.model, threads=model.threads, use_gpu=on_gpu
            )
        except RuntimeError as exc:
            # The text half still works: the model loads without images, and an image
            # line is told why.
            log.warning("model %s loads without its projector: %s", settings.model, exc)
            eyes_error = str(exc)
        eyes_bytes = max(0, native.memory_in_use() - at)
    engine = LlamaEngine(
        settings,
        model,
        model_id=entry.id if entry is not None else None,
        chat_template=entry.profile.chat_template if entry is not None else None,
        projector=eyes,
        projector_error=eyes_error,
    )
    engine.projector_bytes = eyes_bytes
    engine.load_seconds = time.monotonic() - t
    engine.measured_bytes = max(0, native.memory_in_use() - before)
    engine.start()
    return engine


def entry_settings(settings: Settings, entry: Entry) -> Settings:
    """The server's settings with the entry's file and load profile in place of its own."""
    p = entry.profile
    return dataclasses.replace(
        settings,
        model=str(entry.path),
        ctx_size=p.ctx_size,
        parallel=p.parallel,
        n_gpu_layers=p.n_gpu_layers,
        kv_cache_type=p.kv_cache_type,
        shared_prefix_cells=p.shared_prefix_cells,
    )


__all__ = ["entry_settings", "load_engine"]
