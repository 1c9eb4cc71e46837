"""A berth: the pool's record of one catalog model, by the entry's `key` (its file and load
profile, never a name): its state, its engine once loaded, the requests that wait for it
and what its loads took. The pool (pool.py) and its loads (loading.py) change it under the
pool's lock; the plan sees it as a `plan.BerthState`.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.catalog import Entry, LoadProfile
from app.engine.base import ChunkCallback, Engine, ModelInfo, Priority
from app.engine.pool.plan import ON_DISK

#: The pool's one identity of a model: `Entry.key`. Two profiles of one file are two
#: berths (an entry whose profile changed in models.toml keeps its id while its old engine
#: may still be loaded); names of one file with one profile share a berth.
Key = tuple[str, LoadProfile]


class Loaded(Engine, Protocol):
    """An engine the pool loaded for a berth: the Engine contract, and answers under any id
    of its model (`model`: the catalog id a request was routed to; the berth's engine was
    loaded under whichever id came first), and says what its model's load took and gave
    back, for the pool's budget and /metrics (each None where not known: a model not yet
    loaded, or not yet closed)."""

    @property
    def measured_bytes(self) -> int | None:
        """Bytes the model's load took in this process (the buffers llama.cpp allocated
        for it)."""
        ...

    @property
    def load_seconds(self) -> float | None:
        """Seconds the model's load took."""
        ...

    @property
    def freed_bytes(self) -> int | None:
        """Bytes the process gave back when the engine closed (None until it has)."""
        ...

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
        model: str | None = None,
    ) -> Future[dict[str, Any]]: ...


@dataclass
class Waiting:
    """A request that waits for its model to be loaded; `model` is the catalog id it was
    routed to, which its answer carries."""

    berth: Berth
    model: str
    endpoint: str
    body: dict[str, Any]
    priority: Priority
    on_chunk: ChunkCallback | None
    since: float
    future: Future[dict[str, Any]] = field(default_factory=Future)


@dataclass(eq=False)
class Berth:
    """One model the pool knows something about (equal only to itself)."""

    entry: Entry
    state: str = ON_DISK
    engine: Loaded | None = None
    #: The engine's figures at its last load: the default model's stay the pool's `info`
    #: while another model takes its place.
    info: ModelInfo | None = None
    in_flight: int = 0
    waiting: list[Waiting] = field(default_factory=list)
    demand: tuple[int, float | None] = (0, None)  # batch lines waiting, the oldest's time
    loads: int = 0
    last_used: float | None = None
    measured_bytes: int | None = None
    load_seconds: float | None = None
    loaded_at: list[float] = field(default_factory=list)  # when each load finished
    error: str = ""
    wanted: bool = False  # the dashboard's load button
    evict: bool = False  # the dashboard's unload button

    @property
    def key(self) -> Key:
        return self.entry.key

    @property
    def id(self) -> str:
        """The id of the entry it was made for, for logs and errors (an answer carries
        the id its request was routed to)."""
        return self.entry.id

    def need(self) -> int:
        """Bytes it takes once loaded: measured at its last load, else estimated."""
        if self.measured_bytes is not None:
            return self.measured_bytes
        if self.entry.estimate is not None:
            return self.entry.estimate.total
        return self.entry.size_bytes
