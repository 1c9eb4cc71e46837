"""The memory budget of the embedded models: how many bytes the models loaded at once may hold.

`--models-memory` when given; else, measured, the free VRAM on a GPU build (the caller reads
it with `app.toolchain.facts.free_vram_bytes`, as this room may not import the toolchain's)
or the free RAM, each less MARGIN. Measure it before loading any model: memory the node's
own models hold is not free, so a budget measured after their loads is theirs short.
`gib()` writes sizes as the messages that name the budget show them.
"""

from __future__ import annotations

from pathlib import Path

from app.config import Settings

GIB = 1 << 30
#: Left free of the measured memory: llama.cpp's own `--fit` leaves 1024 MiB on each device
#: (`--fit-target`). It is room for what grows after the measure: the node's heap (the
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


__all__ = ["GIB", "MARGIN", "free_ram_bytes", "gib", "memory_budget"]
