"""`ModelPool`: the embedded engine for every model the catalog knows, one loaded at need.

Each loaded model is a `LlamaEngine` of its own (its own context and owner thread), keyed
by the catalog entry's `key` (the file and its load profile, never a name). A request's
`model` picks its entry (`Catalog.route`: a name nothing knows means the default model).
A request for a model that is loaded and fed goes to its engine at once; any other waits
here and is sent when its model is loaded: at once where there is room, else at the next
switch. A swap never fails a request; a model whose file cannot be loaded fails its own
requests with the reason, and the others go on.

One loader thread carries out the plan (plan.py): it loads and unloads (never an engine's
own thread, so decoding goes on meanwhile), reads the next model's file ahead into the page
cache while the current one finishes, and keeps the placement's reservations. The runner
tells the pool which batch lines wait for which model (`demand`), so the plan sees models
that nothing has asked for online; the registry gives a claims lane to each `active` model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.catalog import Entry
from app.catalog.budget import MARGIN, memory_budget
from app.config import AUTO_GPU_LAYERS, Settings
from app.engine.base import (
    ChunkCallback,
    Engine,
    EngineError,
    EngineStats,
    ModelInfo,
    Priority,
    RequestCancelled,
    engine_closed,
    resolve,
)
from app.engine.pool import LOADS_KEPT, ModelView, model_busy, model_not_found
from app.engine.pool.placement import Placement, gpu_layers
from app.engine.pool.plan import FAILED, LOADED, LOADING, ON_DISK, Decision, Model, Plan
from app.toolchain.facts import free_vram_bytes

log = logging.getLogger("batchyard.pool")

#: Seconds between two plans when nothing happened (the TTL and the switch bound are
#: checked this often; a request, a finished line or new demand plans at once).
PLAN_INTERVAL = 0.5
#: Bytes read at a time when a file is read ahead into the page cache.
READ_AHEAD_CHUNK = 8 << 20


class Models(Protocol):
    """What the pool reads of the catalog (app.catalog.Catalog)."""

    def entries(self) -> list[Entry]: ...
    def resolve(self, name: str | None) -> Entry | None: ...
    def default(self) -> Entry: ...
    def route(self, name: str | None) -> Entry: ...
    def get(self, id: str) -> Entry | None: ...
    def names(self) -> frozenset[str]: ...


#: Loads an entry and starts its engine: `app.engine.llama.loading.load_engine` (tests may
#: give another). The engine it returns may say `measured_bytes` and `load_seconds`.
Loader = Callable[[Settings, Entry], Engine]


@dataclass
class _Waiting:
    """A request that waits for its model to be loaded."""

    endpoint: str
    body: dict[str, Any]
    priority: Priority
    on_chunk: ChunkCallback | None
    since: float
    future: Future[dict[str, Any]] = field(default_factory=Future)


@dataclass
class _Slot:
    """One model the pool knows something about, by its entry's key."""

    entry: Entry
    state: str = ON_DISK
    engine: Engine | None = None
    in_flight: int = 0
    waiting: list[_Waiting] = field(default_factory=list)
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
    def id(self) -> str:
        return self.entry.id

    @property
    def pid(self) -> str:
        """Its name in the plan and the placement: unique per key (an entry whose profile
        changed in models.toml keeps its id, and the old engine may still be loaded)."""
        return repr(self.entry.key)

    def need(self) -> int:
        """Bytes it takes once loaded: measured at its last load, else estimated."""
        if self.measured_bytes is not None:
            return self.measured_bytes
        if self.entry.estimate is not None:
            return self.entry.estimate.total
        return self.entry.size_bytes


def load_failed(entry: Entry, reason: str) -> EngineError:
    """The error of a request whose model could not be loaded."""
    return EngineError(
        f"The model '{entry.id}' could not be loaded: {reason}",
        status_code=500,
        code="model_load_failed",
        param="model",
        type="server_error",
    )


def too_big(need: int, budget: int) -> str:
    """Why a model that cannot fit alone is not loaded."""
    return (
        f"it needs {need / 2**30:.2f} GiB, the budget is {budget / 2**30:.2f} GiB (--models-memory)"
    )


def read_ahead(path: Path) -> None:
    """Ask the kernel to read a model file into the page cache (the load then reads memory,
    not the disk); where it cannot be asked, read the file once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        else:  # pragma: no cover - macOS, Windows
            while os.read(fd, READ_AHEAD_CHUNK):
                pass
    except OSError:
        pass
    finally:
        os.close(fd)


class ModelPool:
    """The Engine contract over one llama.cpp engine per loaded model."""

    def __init__(
        self,
        settings: Settings,
        catalog: Models,
        *,
        budget: int,
        loader: Loader | None = None,
        clock: Callable[[], float] = time.time,
        free_vram: Callable[[], int | None] = free_vram_bytes,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.placement = Placement(budget)
        self.plan = Plan(
            self.placement,
            max_loaded=settings.max_loaded_models,
            switch_after=settings.model_switch_after_seconds,
            ttl=settings.model_ttl_seconds,
        )
        self._loader = loader or _llama_loader
        self._clock = clock
        self._free_vram = free_vram
        self._cond = threading.Condition()
        self._slots: dict[tuple[str, Any], _Slot] = {}
        self._active: frozenset[str] = frozenset()
        #: Futures this pool handed out -> the engine running them (to cancel) or the
        #: waiting request they belong to.
        self._owner: dict[Future[dict[str, Any]], tuple[Engine | None, _Waiting | None]] = {}
        #: The figures of engines closed since start, so /metrics' counters never go back.
        self._retired = EngineStats()
        self._default_info: ModelInfo | None = None
        self._prefetched: str | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="model-loader", daemon=True)

    # ------------------------------------------------------------------- start and stop

    def start(self) -> None:
        """Load the default model here and now (a failure raises, as a one-model server's
        did), then start the loader thread."""
        slot = self._slot(self.catalog.default())
        with self._cond:
            slot.state = LOADING
            self.placement.reserve(slot.pid, slot.need(), now=self._clock())
            self.placement.reservations[slot.pid].pinned = True
        try:
            self._load(slot)
        except Exception:
            with self._cond:
                slot.state = ON_DISK
                self.placement.release(slot.pid)
            raise
        default = self.catalog.default()
        with self._cond:
            self._decide(default)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        if self._thread.ident is not None:
            self._thread.join()
        with self._cond:
            slots = list(self._slots.values())
            waiting = [w for s in slots for w in s.waiting]
            for s in slots:
                s.waiting.clear()
        for w in waiting:
            resolve(w.future, error=engine_closed())
        for s in slots:
            if s.engine is not None:
                s.engine.close()
                s.engine = None

    # -------------------------------------------------------------- the Engine contract

    @property
    def info(self) -> ModelInfo:
        """The default model's figures (from its last load: it may be swapped out now)."""
        slot = self._slots.get(self.catalog.default().key)
        if slot is not None and slot.engine is not None:
            self._default_info = slot.engine.info
        assert self._default_info is not None, "the pool is started before it serves"
        return self._default_info

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        name = body.get("model")
        entry = self.catalog.route(name if isinstance(name, str) else None)
        with self._cond:
            if self._closing:
                fut: Future[dict[str, Any]] = Future()
                fut.set_exception(engine_closed())
                return fut
            slot = self._slot(entry)
            if slot.state == FAILED:
                fut = Future()
                fut.set_exception(load_failed(entry, slot.error))
                self._count_failed(1)
                return fut
            engine = slot.engine if slot.pid in self._active else None
            if engine is None and priority == Priority.BATCH and slot.pid in self.plan.draining:
                # A line claimed just before its model stopped being fed: its engine is
                # still loaded, finishing the others; waiting would cost a load later.
                engine = slot.engine
            if engine is None:
                w = _Waiting(endpoint, body, priority, on_chunk, self._clock())
                slot.waiting.append(w)
                self._owner[w.future] = (None, w)
                w.future.add_done_callback(self._forget)
                self._cond.notify_all()
                return w.future
            # Counted before it reaches the engine: the plan never unloads it meanwhile.
            slot.in_flight += 1
            slot.last_used = self._clock()
        return self._send(slot, engine, endpoint, body, priority, on_chunk)

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:
        """The prompt tokens of a request by its model's own tokenizer, where that model is
        loaded now; None where it is not (counting never loads a model)."""
        name = body.get("model")
        entry = self.catalog.route(name if isinstance(name, str) else None)
        with self._cond:
            engine = self._slot(entry).engine
        if engine is None:
            return None
        try:
            return engine.prompt_tokens(endpoint, body)
        except EngineError:  # closed meanwhile, or a request it would refuse: no count
            return None

    def _send(
        self,
        slot: _Slot,
        engine: Engine,
        endpoint: str,
        body: dict[str, Any],
        priority: Priority,
        on_chunk: ChunkCallback | None,
    ) -> Future[dict[str, Any]]:
        """Hand a request to its model's engine (its in-flight count already raised)."""
        try:
            fut = engine.submit(endpoint, body, priority=priority, on_chunk=on_chunk)
        except BaseException:
            self._finished(slot)
            raise
        with self._cond:
            self._owner[fut] = (engine, None)
        fut.add_done_callback(lambda f: self._finished(slot, f))
        return fut

    def _finished(self, slot: _Slot, fut: Future[dict[str, Any]] | None = None) -> None:
        with self._cond:
            slot.in_flight -= 1
            slot.last_used = self._clock()
            if fut is not None:
                self._owner.pop(fut, None)
            if not slot.in_flight:
                self._cond.notify_all()

    def _forget(self, fut: Future[dict[str, Any]]) -> None:
        with self._cond:
            self._owner.pop(fut, None)

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        with self._cond:
            engine, waiting = self._owner.get(future, (None, None))
            if waiting is not None:
                for slot in self._slots.values():
                    if waiting in slot.waiting:
                        slot.waiting.remove(waiting)
        if engine is not None:
            engine.cancel(future)
        elif waiting is not None:
            resolve(future, error=RequestCancelled())

    def stats(self) -> EngineStats:
        """Every loaded engine's figures, plus those of the engines closed since start."""
        with self._cond:
            engines = [s.engine for s in self._slots.values() if s.engine is not None]
            waiting = sum(len(s.waiting) for s in self._slots.values())
            r = self._retired
            total = EngineStats(
                queue_depth=waiting,
                prompt_tokens_total=r.prompt_tokens_total,
                completion_tokens_total=r.completion_tokens_total,
                requests_total=dict(r.requests_total),
            )
        for engine in engines:
            _add(total, engine.stats())
        return total

    # ------------------------------------------------------- what the runner and registry ask

    def demand(self, lines: Mapping[str | None, tuple[int, float]]) -> None:
        """The batch lines waiting, by the model their batch names: (count, the oldest's
        unix time since it waited). Names map to entries as requests' do."""
        by_key: dict[tuple[str, Any], tuple[int, float | None]] = {}
        entries: dict[tuple[str, Any], Entry] = {}
        for name, (count, oldest) in lines.items():
            entry = self.catalog.route(name)
            entries[entry.key] = entry
            n, t = by_key.get(entry.key, (0, None))
            by_key[entry.key] = (n + count, oldest if t is None else min(t, oldest))
        with self._cond:
            for entry in entries.values():
                self._slot(entry)
            changed = False
            for key, slot in self._slots.items():
                want = by_key.get(key, (0, None))
                changed |= bool(want[0]) and not slot.demand[0]
                slot.demand = want
            if changed:
                self._cond.notify_all()

    def active(self) -> list[tuple[Entry, int]]:
        """The models whose lines may be claimed now, each with its engine's slots: the
        loaded ones the plan feeds, and failed ones (their lines fail with the reason)."""
        with self._cond:
            out = []
            for slot in self._slots.values():
                if slot.pid not in self._active:
                    continue
                slots = slot.engine.info.lane_slots if slot.engine is not None else 1
                out.append((slot.entry, slots))
            return out

    # ------------------------------------------------------------- dashboard and /metrics

    def views(self) -> list[ModelView]:
        """Every model the catalog lists, and any loaded model it no longer lists."""
        entries = self.catalog.entries()
        with self._cond:
            listed = {e.key for e in entries}
            extra = [s.entry for k, s in self._slots.items() if k not in listed]
            views = []
            for entry in entries + extra:
                slot = self._slots.get(entry.key)
                if slot is None:
                    views.append(ModelView(entry, ON_DISK, 0, 0, 0, None, None, None))
                    continue
                state = slot.state
                if state == LOADED and not slot.in_flight:
                    state = "idle"
                views.append(
                    ModelView(
                        entry=entry,
                        state=state,
                        in_flight=slot.in_flight,
                        waiting=slot.demand[0] + len(slot.waiting),
                        loads=slot.loads,
                        last_used=slot.last_used,
                        measured_bytes=slot.measured_bytes,
                        load_seconds=slot.load_seconds,
                        error=slot.error,
                        loaded_at=tuple(slot.loaded_at),
                    )
                )
            return views

    def budget(self) -> tuple[int, int]:
        """(bytes reserved by the models loaded or loading, the budget)."""
        with self._cond:
            return self.placement.reserved(), self.placement.budget

    def load(self, id: str) -> None:
        """Load a model now (the dashboard's button): as a request that has waited past
        the switch bound, it displaces idle models, or drains busy ones first."""
        entry = self._entry(id)
        with self._cond:
            slot = self._slot(entry)
            if slot.state == FAILED:
                slot.state, slot.error = ON_DISK, ""  # try again: the file may be mended
            slot.wanted = slot.state == ON_DISK
            self._cond.notify_all()

    def unload(self, id: str) -> None:
        """Unload a model now (the dashboard's button); refused while lines are in flight."""
        entry = self._entry(id)
        with self._cond:
            slot = self._slot(entry)
            if slot.in_flight:
                raise model_busy(id, slot.in_flight)
            slot.evict = slot.state == LOADED
            slot.wanted = False
            self._cond.notify_all()

    def _entry(self, id: str) -> Entry:
        entry = self.catalog.get(id)
        if entry is None:
            raise model_not_found(id)
        return entry

    # ------------------------------------------------------------------ the loader thread

    def _slot(self, entry: Entry) -> _Slot:
        """The slot of an entry (under the lock). A model that failed to load is tried
        again once its file changed (the catalog re-reads it: a download finished, a
        corrupt file replaced)."""
        slot = self._slots.get(entry.key)
        if slot is None:
            slot = self._slots[entry.key] = _Slot(entry)
        elif slot.state == FAILED and (entry.mtime, entry.size_bytes) != (
            slot.entry.mtime,
            slot.entry.size_bytes,
        ):
            slot.entry, slot.state, slot.error = entry, ON_DISK, ""
        return slot

    def _run(self) -> None:
        while True:
            default = self.catalog.default()  # the catalog may read its stores: not locked
            with self._cond:
                if self._closing:
                    return
                decision = self._decide(default)
            # Before any unload or load: a model just loaded gets its waiting requests
            # now, so the next plan sees them in flight and never swaps it out unused.
            self._dispatch()
            self._carry_out(decision)
            with self._cond:
                if self._closing:
                    return
                if decision.load is None and not decision.unload:
                    self._cond.wait(PLAN_INTERVAL)

    def _decide(self, default_entry: Entry) -> Decision:
        """One step of the plan over every slot's state now (under the lock)."""
        now = self._clock()
        default = default_entry.key
        models = []
        for slot in self._slots.values():
            n, oldest = slot.demand
            if slot.waiting:
                n += len(slot.waiting)
                first = slot.waiting[0].since
                oldest = first if oldest is None else min(oldest, first)
            if slot.wanted:
                n, oldest = n + 1, float("-inf")
            state = slot.state
            if n and state == ON_DISK and slot.entry.key != default:
                need = slot.need()
                if need > self.placement.budget:
                    # It never fits, whatever is unloaded: its requests fail, saying why.
                    self._fail_slot(slot, too_big(need, self.placement.budget))
                    state = FAILED
            if slot.evict:
                if state == LOADED and not slot.in_flight:
                    self.plan.draining.add(slot.pid)
                slot.evict = False
            self.placement.set_in_flight(slot.pid, slot.in_flight)
            if slot.last_used is not None:
                self.placement.touch(slot.pid, slot.last_used)
            models.append(
                Model(
                    id=slot.pid,
                    need=slot.need(),
                    waiting=n,
                    oldest=oldest,
                    in_flight=slot.in_flight,
                    state=state,
                    last_used=slot.last_used or 0.0,
                    pinned=slot.entry.key == default,
                )
            )
        decision = self.plan.step(now, models)
        self._active = decision.active
        return decision

    def _carry_out(self, decision: Decision) -> None:
        with self._cond:
            by_pid = {s.pid: s for s in self._slots.values()}
        for pid in decision.unload:
            self._close(by_pid[pid])
        if decision.prefetch and decision.prefetch != self._prefetched:
            self._prefetched = decision.prefetch
            entry = by_pid[decision.prefetch].entry
            threading.Thread(
                target=read_ahead, args=(entry.path,), name="read-ahead", daemon=True
            ).start()
        if decision.load:
            slot = by_pid[decision.load]
            self._prefetched = None  # read ahead again next time it is to load
            if slot.entry.error:
                # The catalog could not read the file's header: llama.cpp would fail on it
                # too, with a vaguer reason (and the CPU check would run on a broken file).
                log.warning("model=%s is not loaded: %s", slot.id, slot.entry.error)
                self._failed(slot, slot.entry.error)
                return
            with self._cond:
                slot.state, slot.wanted = LOADING, False
                self.placement.reserve(slot.pid, slot.need(), now=self._clock())
            try:
                self._load(slot)
            except Exception as exc:
                log.exception("model=%s could not be loaded", slot.id)
                self._failed(slot, f"{type(exc).__name__}: {exc}")

    def _load(self, slot: _Slot) -> None:
        """Load the slot's model (its reservation made) and note what the load took."""
        t = time.monotonic()
        engine = self._loader(self.settings, self._placed(slot.entry))
        seconds = getattr(engine, "load_seconds", None) or time.monotonic() - t
        measured = getattr(engine, "measured_bytes", None)
        with self._cond:
            slot.engine, slot.state, slot.error = engine, LOADED, ""
            slot.loads += 1
            slot.loaded_at = [*slot.loaded_at[1 - LOADS_KEPT :], self._clock()]
            slot.load_seconds = seconds
            slot.last_used = self._clock()
            if measured:
                slot.measured_bytes = measured
                self.placement.measured(slot.pid, measured)
            if slot.entry.key == self.catalog.default().key:
                self._default_info = engine.info
            estimate = slot.entry.estimate.total if slot.entry.estimate else None
        log.info(
            "model=%s loaded in %.2fs loads=%d estimate=%s measured=%s",
            slot.id,
            seconds,
            slot.loads,
            _mib(estimate),
            _mib(measured),
        )

    def _placed(self, entry: Entry) -> Entry:
        """The entry as it loads: --n-gpu-layers auto made a number of layers that the free
        VRAM holds now (the models already loaded have taken theirs). Its key stays the
        catalog's: the slot is the entry as listed."""
        profile = entry.profile
        if profile.n_gpu_layers != AUTO_GPU_LAYERS:
            return entry
        n_layer = entry.facts.n_layer if entry.facts else 0
        layers = gpu_layers(n_layer, entry.estimate, self._free_vram(), MARGIN)
        log.info("model=%s n_gpu_layers auto: %d", entry.id, layers)
        return dataclasses.replace(entry, profile=dataclasses.replace(profile, n_gpu_layers=layers))

    def _failed(self, slot: _Slot, reason: str) -> None:
        with self._cond:
            self._fail_slot(slot, reason)

    def _fail_slot(self, slot: _Slot, reason: str) -> None:
        """The model cannot be loaded: it and its waiting requests fail (under the lock;
        the futures' callbacks only queue work)."""
        slot.state, slot.error = FAILED, reason
        self.placement.release(slot.pid)
        waiting, slot.waiting = slot.waiting, []
        failed = sum(resolve(w.future, error=load_failed(slot.entry, reason)) for w in waiting)
        self._count_failed(failed)

    def _count_failed(self, n: int) -> None:
        """Requests the pool failed itself (their model cannot load), for /metrics."""
        if n:
            counts = self._retired.requests_total
            counts["failed"] = counts.get("failed", 0) + n

    def _close(self, slot: _Slot) -> None:
        """Unload a model with nothing in flight; its bytes are free once it has closed."""
        with self._cond:
            engine, slot.engine = slot.engine, None
            slot.state = ON_DISK
            assert not slot.in_flight, "a model is never unloaded with lines in flight"
        if engine is not None:
            stats = engine.stats()
            engine.close()
            with self._cond:
                stats.active_slots = stats.queue_depth = 0
                stats.tokens_per_second = 0.0
                _add(self._retired, stats)
        with self._cond:
            self.placement.release(slot.pid)
        freed = getattr(engine, "freed_bytes", None)
        log.info("model=%s unloaded freed=%s measured=%s", slot.id, _mib(freed), _mib(slot.need()))
        if freed is not None and slot.measured_bytes and freed < slot.measured_bytes // 2:
            # The budget counts the model's bytes free again; the process says otherwise.
            log.warning(
                "model=%s gave back %s of the %s its load took",
                slot.id,
                _mib(freed),
                _mib(slot.measured_bytes),
            )

    def _dispatch(self) -> None:
        """Send the waiting requests of every model now fed to its engine."""
        sends = []
        with self._cond:
            for slot in self._slots.values():
                if slot.pid not in self._active or slot.engine is None or not slot.waiting:
                    continue
                for w in slot.waiting:
                    if not w.future.done():
                        slot.in_flight += 1
                        sends.append((slot, slot.engine, w))
                slot.waiting = []
        for slot, engine, w in sends:
            # The caller holds the waiting request's future: the engine's resolves it, and
            # cancelling it (pool.cancel) withdraws the engine's.
            inner = self._send(slot, engine, w.endpoint, w.body, w.priority, w.on_chunk)
            _chain(inner, w.future, engine)


def _chain(inner: Future[dict[str, Any]], outer: Future[dict[str, Any]], engine: Engine) -> None:
    """The engine's future resolves the caller's; the caller's resolved first (cancelled)
    withdraws the engine's (a finished one it leaves alone)."""

    def settle(f: Future[dict[str, Any]]) -> None:
        exc = f.exception()
        resolve(outer, result=None if exc else f.result(), error=exc)

    inner.add_done_callback(settle)
    outer.add_done_callback(lambda _: engine.cancel(inner))


def _add(total: EngineStats, s: EngineStats) -> None:
    total.active_slots += s.active_slots
    total.queue_depth += s.queue_depth
    total.tokens_per_second += s.tokens_per_second
    total.prompt_tokens_total += s.prompt_tokens_total
    total.completion_tokens_total += s.completion_tokens_total
    for outcome, n in s.requests_total.items():
        total.requests_total[outcome] = total.requests_total.get(outcome, 0) + n


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.0f}MiB" if n else "-"


def node_budget(settings: Settings) -> int:
    """The bytes the loaded models may take together (catalog/budget.py): --models-memory,
    else the free VRAM on a CUDA build, else the free RAM, less a margin."""
    return memory_budget(settings, free_vram=free_vram_bytes())


def _llama_loader(settings: Settings, entry: Entry) -> Engine:
    # Imported here: llama_cpp loads its libraries on import (registry.load_engines).
    from app.engine.llama import loading

    return loading.load_engine(settings, entry)
