"""Loading a model into a LlamaEngine: the model's llama.cpp contexts (native.py), its
projector where it has one (vision.py), and what the load took (memory, seconds).

The memory is the buffers llama.cpp reports allocating for this load (buffers.py): its
weights (a mapped file counted whole, touched or not), KV caches, compute and output
buffers, and the projector's. Loads side by side are each measured alone. Where llama.cpp
reports none, the process's memory before and after stands in (and a warning says so).

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
from app.engine.llama.binding import buffers, native, vision
from app.engine.llama.contexts.slots import BATCH_PROMPT_TOKENS_PER_STEP
from app.engine.llama.engine import LlamaEngine

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
    with buffers.capture() as taken:
        model = native.load(
            path, profile, settings, prompt_tokens_per_step=BATCH_PROMPT_TOKENS_PER_STEP
        )
    model_bytes = _measured(f"model {path}", taken, before)
    loaded_projector, projector_bytes, projector_error = None, None, None
    if projector is not None:
        at = native.memory_in_use()
        with buffers.capture() as taken:
            try:
                loaded_projector = vision.Projector(
                    Path(projector),
                    model.model,
                    threads=model.threads,
                    use_gpu=model.gpu_backend is not None,
                )
            except RuntimeError as exc:
                # The text half still works: the model loads without images, and an image
                # line is told why.
                log.warning("model %s loads without its projector: %s", path, exc)
                projector_error = str(exc)
        # A projector that failed has freed what it took.
        projector_bytes = _measured(f"projector {projector}", taken, at) if loaded_projector else 0
    engine = LlamaEngine(
        settings,
        model,
        model_id=entry.id if entry is not None else None,
        chat_template=profile.chat_template,
        projector=loaded_projector,
        projector_error=projector_error,
    )
    engine.projector_bytes = projector_bytes
    engine.load_seconds = time.monotonic() - t
    engine.measured_bytes = model_bytes + (projector_bytes or 0)
    engine.start()
    return engine


def _measured(what: str, taken: buffers.Buffers, before: int) -> int:
    """The bytes a load took: the buffers llama.cpp reported, else the process's memory
    since `before` (which counts any other load under way meanwhile)."""
    if taken.total:
        log.info("%s took %s", what, taken.describe())
        return taken.total
    log.warning(
        "%s: llama.cpp reported no buffer sizes while loading; measured by the process's "
        "memory instead",
        what,
    )
    return max(0, native.memory_in_use() - before)


__all__ = ["load_engine"]
