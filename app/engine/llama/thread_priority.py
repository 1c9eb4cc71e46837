"""The llama engines' CPU priority: below the HTTP API's, so the API answers while the
engine keeps every core busy.

On a machine whose cores all decode, a request's thread waits for a core behind llama.cpp's
threads; its p99 under load was several times its idle p99 (bench/api_load.py). The engine's
owner thread lowers its own priority before its first decode, and llama.cpp's OpenMP workers,
which that thread starts, inherit it. Lowering a priority needs no privilege; raising it back
would, so it is done once, in the engine's own thread, and nowhere else.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("batchyard.engine")


def effective(setting: str, *, on_gpu: bool) -> str:
    """`auto` is `low` on a CPU and `normal` when a GPU runs the model: there the engine's
    thread mostly launches kernels, and making it wait would idle the GPU."""
    if setting == "auto":
        return "normal" if on_gpu else "low"
    return setting


def lower_this_thread() -> str:
    """Put the calling thread, and the threads it starts from now on, at the lowest CPU
    priority the OS offers; says what was done, for the start-up line."""
    if not sys.platform.startswith("linux"):
        return "normal (a per-thread priority needs Linux)"
    try:
        # Linux: pid 0 is the calling thread. SCHED_IDLE runs it only when no ordinary
        # thread wants the core; it still takes every core that nothing else uses.
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "low (SCHED_IDLE)"
    except (AttributeError, OSError) as exc:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 19)  # pid 0 is this thread on Linux too
            return "low (nice 19)"
        except OSError as nice_exc:
            why = f"SCHED_IDLE: {exc}; nice 19: {nice_exc}"
            log.warning("the engine's priority could not be lowered (%s)", why)
            return f"normal (could not be lowered: {why})"
