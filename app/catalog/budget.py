"""The memory budget of the embedded models: how many bytes the models loaded at once may hold.

`--models-memory` when given; else, measured, the free VRAM on a GPU build (the caller reads
it with `app.toolchain.facts.free_vram_bytes`, as this package may not import the toolchain's)
or the free RAM, each less MARGIN. Measure it before loading any model: memory the node's
own models hold is not free, so a budget measured after their loads is theirs short.
`gpu_layers()` resolves --n-gpu-layers auto for a load, and `gib()` writes sizes as the
messages that name the budget show them.
"""

from __future__ import annotations

from pathlib import Path

from app.catalog.entry import Estimate
from app.config import AUTO_GPU_LAYERS, Settings

GIB = 1 << 30
#: Left free of the measured memory: llama.cpp's own `--fit` leaves 1024 MiB on each device
#: (`--fit-target`). It is headroom for what grows after the measure: the node's heap (the
#: batches in flight, an output file being written), other programs, and the error of the
#: estimate's compute-buffer term, which is a formula, not a measure.
MARGIN = GIB
#: Where the kernel says how much memory is free (Linux).
MEMINFO = Path("/proc/meminfo")


def memory_budget(settings: Settings, *, free_vram: int | None = None) -> int:
    """The budget in bytes: --models-memory; else `free_vram` (bytes, on a GPU build whose
    models go to the GPU) or the free RAM, less MARGIN, and never below 0."""
    given = settings.models_memory_bytes
    if given is not None:
        return given
    if free_vram is not None and settings.n_gpu_layers != 0:
        return max(0, free_vram - MARGIN)
    return max(0, free_ram_bytes() - MARGIN)


def gpu_layers(
    n_gpu_layers: int,
    n_layer: int,
    estimate: Estimate | None,
    free_vram: int | None,
    margin: int = MARGIN,
) -> int:
    """The layers a load offloads: a number (the flag's, models.toml's) as it is; auto
    (AUTO_GPU_LAYERS) as many of the model's `n_layer` layers as `free_vram` holds, as
    llama.cpp's --fit does (it keeps --fit-target, 1 GiB, free on each device: `margin`).
    The one place auto is resolved: the pool calls it before each load (the free VRAM less
    what the loads beside it take), and so does a model loaded alone (engine/llama/loading.py).

    The compute buffer goes first; each layer then takes an equal share of the weights and
    the KV cache, the output layer counted as one more (-1, all, offloads it too). 0 without
    a GPU (`free_vram` None); -1 with no estimate to go by (a model loaded alone; a file
    whose header was unread, whose load fails with the reason anyway)."""
    if n_gpu_layers != AUTO_GPU_LAYERS:
        return n_gpu_layers
    if free_vram is None:
        return 0
    if estimate is None or n_layer <= 0:
        return -1
    spare = free_vram - margin - estimate.compute
    per_layer = (estimate.weights + estimate.kv_cache) / (n_layer + 1)
    fit = int(spare // per_layer) if spare > 0 else 0
    return -1 if fit > n_layer else fit


def free_ram_bytes(meminfo: Path | None = None) -> int:
    """MemAvailable from /proc/meminfo, in bytes: the kernel's estimate of what a new program
    may take without swapping, the free pages and the page cache it can drop (MemFree
    leaves the cache out, and a model file read once sits in it).

    Raises OSError where there is none (not Linux, or a kernel before 3.14): set
    --models-memory there."""
    meminfo = meminfo or MEMINFO
    try:
        text = meminfo.read_text()
    except OSError as exc:
        raise OSError(f"cannot read {meminfo} ({exc.strerror}): set --models-memory") from exc
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            amount, _, unit = value.strip().partition(" ")
            return int(amount) * (1024 if unit.strip() == "kB" else 1)
    raise OSError(f"{meminfo} has no MemAvailable line: set --models-memory")


def gib(n: int) -> str:
    """Bytes as messages show them: "1.23 GiB"."""
    return f"{n / GIB:.2f} GiB"


__all__ = ["GIB", "MARGIN", "free_ram_bytes", "gib", "gpu_layers", "memory_budget"]
