"""The embedded engine for several models: loaded on demand, within a memory budget.

`ModelPool` (pool.py) is one Engine over one llama.cpp engine per loaded model, each in a
berth (berth.py); `plan.py` decides which model to feed, load and unload next, `loading.py`
carries out the loads and unloads, and `placement.py` keeps the bytes each model holds in
the budget. The dashboard and /metrics read `ModelPool.views()` and `ModelPool.budget()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from app.catalog import Entry
from app.engine.base import EngineError


@dataclass
class ModelView:
    """One catalog model as the dashboard's Models page and /metrics show it."""

    entry: Entry
    state: str  # "loaded" | "loading" | "idle" | "on disk" | "failed"  (idle: loaded, nothing in flight)
    in_flight: int
    waiting: int  # requests waiting: batch lines pending (the runner's demand) + online ones
    loads: int  # times loaded since start
    last_used: float | None  # unix time
    measured_bytes: int | None
    load_seconds: float | None  # the last load's
    error: str = ""
    #: When each load since start finished (unix times, the last LOADS_KEPT): a batch page
    #: counts the loads its model took while it ran.
    loaded_at: tuple[float, ...] = ()


class Fed(NamedTuple):
    """A model whose lines may be claimed now (`ModelPool.active`)."""

    entry: Entry  # its berth's
    #: Every catalog id of its berth, the berth's own first: one file under one profile
    #: may be listed under several ids (`ollama cp` names one blob twice), one engine for all.
    ids: tuple[str, ...]
    slots: int  # its engine's lane slots (1 for a failed model: its lines fail at once)


#: How many load times a model keeps for `ModelView.loaded_at`.
LOADS_KEPT = 100


def model_not_found(id: str) -> EngineError:
    """The dashboard's load or unload of an id the catalog does not hold."""
    return EngineError(
        f"The model '{id}' does not exist.",
        status_code=404,
        param="model",
        code="model_not_found",
    )


def model_busy(id: str, in_flight: int) -> EngineError:
    """An unload refused while the model still has requests in flight."""
    return EngineError(
        f"The model '{id}' has {in_flight} requests in flight; "
        "it is unloaded only when they are done.",
        status_code=409,
        code="model_busy",
    )


__all__ = ["LOADS_KEPT", "Fed", "ModelView", "model_busy", "model_not_found"]
