"""Loading a model into a LlamaEngine: the model's llama.cpp contexts (native.py), its
projector where it has one (vision.py), and what the load took (memory, seconds).

The pool (engine/pool/) loads each catalog entry through `load_engine`, with its load
profile; a lone engine (a test's, a bench's) loads the server's own model with the server's
flags as its profile (`server_profile`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc

from app.catalog import Entry, server_profile
from app.catalog.budget import gpu_layers
from app.config import AUTO_GPU_LAYERS, Settings
from app.engine.llama import native, vision
from app.engine.llama.engine import LlamaEngine
from app.engine.llama.slots import BATCH_PROMPT_TOKENS_PER_STEP

log = logging.getLogger("batchyard.engine")


def load_engine(
    settings: Settings, entry: Entry | None = None, *, projector: Path | None = None
) -> LlamaEngine:
    """Load a catalog entry with its load profile (or the server's own model with its flags)
    and start its owner thread. The engine says what the load took: `measured_bytes`,
    `load_seconds`.

    A multimodal projector (`projector`, or the entry's) loads with the model, and the
    engine then takes images in chat and responses bodies (`info.takes_images`)."""
    if entry is not None:
        path, profile = entry.path, entry.profile
        projector = projector or entry.projector
    else:
        path, profile = settings.model_path, server_profile(settings)
    if profile.n_gpu_layers == AUTO_GPU_LAYERS:
        # --n-gpu-layers auto that the pool did not place (a model loaded alone): by the
        # entry's estimate where there is one, else every layer on a GPU there is one.
        free = native.gpu_free_bytes() if lc.llama_supports_gpu_offload() else None
        facts = entry.facts if entry is not None else None
        estimate = entry.estimate if entry is not None else None
        layers = gpu_layers(profile.n_gpu_layers, facts.n_layer if facts else 0, estimate, free)
        profile = dataclasses.replace(profile, n_gpu_layers=layers)
    before, t = native.memory_in_use(), time.monotonic()
    model = native.load(
        path, profile, settings, prompt_tokens_per_step=BATCH_PROMPT_TOKENS_PER_STEP
    )
    eyes, eyes_bytes, eyes_error = None, None, None
    if projector is not None:
        at = native.memory_in_use()
        try:
            eyes = vision.Projector(
                Path(projector),
                model.model,
                threads=model.threads,
                use_gpu=model.gpu_backend is not None,
            )
        except RuntimeError as exc:
            # The text half still works: the model loads without images, and an image
            # line is told why.
            log.warning("model %s loads without its projector: %s", path, exc)
            eyes_error = str(exc)
        eyes_bytes = max(0, native.memory_in_use() - at)
    engine = LlamaEngine(
        settings,
        model,
        model_id=entry.id if entry is not None else None,
        chat_template=profile.chat_template,
        projector=eyes,
        projector_error=eyes_error,
    )
    engine.projector_bytes = eyes_bytes
    engine.load_seconds = time.monotonic() - t
    engine.measured_bytes = max(0, native.memory_in_use() - before)
    engine.start()
    return engine


__all__ = ["load_engine"]
