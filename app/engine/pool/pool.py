"""`ModelPool`: the embedded engine for every model the catalog knows, loaded at need.

Each loaded model is a `LlamaEngine` of its own (its own context and owner thread), held in
a berth (berth.py) keyed by the catalog entry's `key` (the file and its load profile, never
a name). A request's `model` picks its entry (`Catalog.entry_for`: a name nothing knows means
the default model). A request for a model that is loaded and fed goes to its engine at
once; any other waits in its berth and is sent when its model is loaded: at once where
the budget holds it, else at the next switch. A swap never fails a request; a model whose file
cannot be loaded fails its own requests with the reason, and the others go on.

The pool's loop thread steps the plan (plan.py) over a snapshot of every berth and carries
out its decision: it unloads (never on an engine's own thread, so decoding goes on
meanwhile), starts the loads (loading.py: in threads of their own, side by side where the
budget holds them all) and reads the next model's file ahead. The runner tells the pool
which batch lines wait for which model (`demand`), so the plan sees models that nothing
has asked for online; the registry gives a claims lane to each `active` model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from app.catalog import Entry
from app.config import Settings
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
from app.engine.pool import Fed, ModelView, model_busy, model_not_found
from app.engine.pool.berth import Berth, Key, Loaded, Waiting
from app.engine.pool.loading import Loader, Loads, llama_loader, load_failed, too_big
from app.engine.pool.placement import Placement
from app.engine.pool.plan import FAILED, LOADED, ON_DISK, BerthState, Decision, Plan
from app.toolchain.facts import free_vram_bytes

#: Seconds between two plans when nothing happened (the TTL and the switch bound are
#: checked this often; a request, a finished line, a load's end or new demand plans at once).
PLAN_INTERVAL = 0.5


class Models(Protocol):
    """What the pool reads of the catalog (app.catalog.Catalog)."""

    def entries(self) -> list[Entry]: ...
    def resolve(self, name: str | None) -> Entry | None: ...
    def default(self) -> Entry: ...
    def entry_for(self, name: str | None) -> Entry: ...
    def get(self, id: str) -> Entry | None: ...
    def names(self) -> frozenset[str]: ...


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
        self._plan = Plan(
            budget=budget,
            max_loaded=settings.max_loaded_models,
            switch_after=settings.model_switch_after_seconds,
            ttl=settings.model_ttl_seconds,
        )
        self._clock = clock
        self._cond = threading.Condition()
        self._loads = Loads(
            settings,
            self.placement,
            self._cond,
            loader=loader or llama_loader,
            clock=clock,
            free_vram=free_vram,
        )
        self._berths: dict[Key, Berth] = {}
        #: The plan's last decision: the models fed now, and those drained.
        self._decision = Decision(active=frozenset())
        #: Futures this pool handed out -> the engine running them (to cancel) or the
        #: request that waits for its model.
        self._owner: dict[Future[dict[str, Any]], Engine | Waiting] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="model-pool", daemon=True)

    # ------------------------------------------------------------------- start and stop

    def start(self) -> None:
        """Load the default model here and now (a failure raises, as a one-model server's
        did), then start the loop thread."""
        default = self.catalog.default()
        with self._cond:
            berth = self._berth(default)
        self._loads.load_now(berth)
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
        self._loads.join()
        with self._cond:
            berths = list(self._berths.values())
            waiting = [w for b in berths for w in b.waiting]
            for b in berths:
                b.waiting.clear()
        for w in waiting:
            resolve(w.future, error=engine_closed())
        for b in berths:
            if b.engine is not None:
                b.engine.close()
                b.engine = None

    # -------------------------------------------------------------- the Engine contract

    @property
    def info(self) -> ModelInfo:
        """The default model's figures (from its last load: it may be swapped out now)."""
        berth = self._berths.get(self.catalog.default().key)
        assert berth is not None and berth.info is not None, "the pool is started first"
        return berth.engine.info if berth.engine is not None else berth.info

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        name = body.get("model")
        entry = self.catalog.entry_for(name if isinstance(name, str) else None)
        with self._cond:
            if self._closing:
                fut: Future[dict[str, Any]] = Future()
                fut.set_exception(engine_closed())
                return fut
            berth = self._berth(entry)
            if berth.state == FAILED:
                fut = Future()
                fut.set_exception(load_failed(entry, berth.error))
                self._loads.count_failed(1)
                return fut
            engine = berth.engine if berth.key in self._decision.active else None
            if engine is None and priority == Priority.BATCH and berth.key in self._decision.drain:
                # A line claimed just before its model stopped being fed: its engine is
                # still loaded, finishing the others; waiting would cost a load later.
                engine = berth.engine
            if engine is None:
                w = Waiting(berth, entry.id, endpoint, body, priority, on_chunk, self._clock())
                berth.waiting.append(w)
                self._owner[w.future] = w
                w.future.add_done_callback(self._forget)
                self._cond.notify_all()
                return w.future
            # Counted before it reaches the engine: the plan never unloads it meanwhile.
            berth.in_flight += 1
            berth.last_used = self._clock()
        return self._send(
            berth, engine, entry.id, endpoint, body, priority=priority, on_chunk=on_chunk
        )

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:
        """The prompt tokens of a request by its model's own tokenizer, where that model is
        loaded now; None where it is not (counting never loads a model)."""
        name = body.get("model")
        entry = self.catalog.entry_for(name if isinstance(name, str) else None)
        with self._cond:
            engine = self._berth(entry).engine
        if engine is None:
            return None
        try:
            return engine.prompt_tokens(endpoint, body)
        except EngineError:  # closed meanwhile, or a request it would refuse: no count
            return None

    def image_form(self, model: str | None) -> tuple[str, int]:  # noqa: ARG002 - the Engine contract
        """PNG and JPEG data URLs, any size: its projector scales them."""
        return ("png", 0)

    def _send(
        self,
        berth: Berth,
        engine: Loaded,
        model: str,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority,
        on_chunk: ChunkCallback | None,
    ) -> Future[dict[str, Any]]:
        """Hand a request to its model's engine (its in-flight count already raised), to be
        answered as `model`: the id it was routed to, of the berth's engine's model."""
        try:
            fut = engine.submit(endpoint, body, priority=priority, on_chunk=on_chunk, model=model)
        except BaseException:
            self._finished(berth)
            raise
        with self._cond:
            self._owner[fut] = engine
        fut.add_done_callback(lambda f: self._finished(berth, f))
        return fut

    def _finished(self, berth: Berth, fut: Future[dict[str, Any]] | None = None) -> None:
        with self._cond:
            berth.in_flight -= 1
            berth.last_used = self._clock()
            if fut is not None:
                self._owner.pop(fut, None)
            if not berth.in_flight:
                self._cond.notify_all()

    def _forget(self, fut: Future[dict[str, Any]]) -> None:
        with self._cond:
            self._owner.pop(fut, None)

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        with self._cond:
            owner = self._owner.get(future)
            if isinstance(owner, Waiting) and owner in owner.berth.waiting:
                owner.berth.waiting.remove(owner)
        if isinstance(owner, Waiting):
            resolve(future, error=RequestCancelled())
        elif owner is not None:
            owner.cancel(future)

    def stats(self) -> EngineStats:
        """Every loaded engine's figures, plus those of the engines closed since start."""
        with self._cond:
            engines = [b.engine for b in self._berths.values() if b.engine is not None]
            waiting = sum(len(b.waiting) for b in self._berths.values())
            r = self._loads.retired
            total = EngineStats(
                queue_depth=waiting,
                prompt_tokens_total=r.prompt_tokens_total,
                completion_tokens_total=r.completion_tokens_total,
                requests_total=dict(r.requests_total),
                images_encoded=r.images_encoded,
            )
        for engine in engines:
            total.add(engine.stats())
        return total

    # ------------------------------------------------------- what the runner and registry ask

    def demand(self, lines: Mapping[str, tuple[int, float]]) -> None:
        """The batch lines waiting, by the catalog id of their model (the batch's route):
        (count, the oldest's unix time since it waited). An id the catalog no longer holds
        counts for nothing."""
        by_key: dict[Key, tuple[int, float | None]] = {}
        entries: dict[Key, Entry] = {}
        for id, (count, oldest) in lines.items():
            entry = self.catalog.get(id)
            if entry is None:
                continue
            entries[entry.key] = entry
            n, t = by_key.get(entry.key, (0, None))
            by_key[entry.key] = (n + count, oldest if t is None else min(t, oldest))
        with self._cond:
            for entry in entries.values():
                self._berth(entry)
            changed = False
            for key, berth in self._berths.items():
                want = by_key.get(key, (0, None))
                changed |= bool(want[0]) and not berth.demand[0]
                berth.demand = want
            if changed:
                self._cond.notify_all()

    def active(self) -> list[Fed]:
        """The models whose lines may be claimed now, each with every id the catalog lists
        it under and its engine's slots: the loaded ones the plan feeds, and failed ones
        (their lines fail with the reason)."""
        ids: dict[Key, list[str]] = {}
        for entry in self.catalog.entries():
            ids.setdefault(entry.key, []).append(entry.id)
        with self._cond:
            out = []
            for berth in self._berths.values():
                if berth.key not in self._decision.active:
                    continue
                slots = berth.engine.info.lane_sequences if berth.engine is not None else 1
                others = [i for i in ids.get(berth.key, []) if i != berth.id]
                out.append(Fed(berth.entry, (berth.id, *others), slots))
            return out

    # ------------------------------------------------------------- dashboard and /metrics

    def views(self) -> list[ModelView]:
        """Every model the catalog lists, and any loaded model it no longer lists."""
        entries = self.catalog.entries()
        with self._cond:
            listed = {e.key for e in entries}
            extra = [b.entry for k, b in self._berths.items() if k not in listed]
            views = []
            for entry in entries + extra:
                berth = self._berths.get(entry.key)
                if berth is None:
                    views.append(ModelView(entry, ON_DISK, 0, 0, 0, None, None, None))
                    continue
                state = berth.state
                if state == LOADED and not berth.in_flight:
                    state = "idle"
                views.append(
                    ModelView(
                        entry=entry,
                        state=state,
                        in_flight=berth.in_flight,
                        waiting=berth.demand[0] + len(berth.waiting),
                        loads=berth.loads,
                        last_used=berth.last_used,
                        measured_bytes=berth.measured_bytes,
                        load_seconds=berth.load_seconds,
                        error=berth.error,
                        loaded_at=tuple(berth.loaded_at),
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
            berth = self._berth(entry)
            if berth.state == FAILED:
                berth.state, berth.error = ON_DISK, ""  # try again: the file may be mended
            berth.wanted = berth.state == ON_DISK
            self._cond.notify_all()

    def unload(self, id: str) -> None:
        """Unload a model now (the dashboard's button); refused while requests are in flight."""
        entry = self._entry(id)
        with self._cond:
            berth = self._berth(entry)
            if berth.in_flight:
                raise model_busy(id, berth.in_flight)
            berth.evict = berth.state == LOADED
            berth.wanted = False
            self._cond.notify_all()

    def _entry(self, id: str) -> Entry:
        entry = self.catalog.get(id)
        if entry is None:
            raise model_not_found(id)
        return entry

    # ------------------------------------------------------------------ the loop thread

    def _berth(self, entry: Entry) -> Berth:
        """The berth of an entry (under the lock). A model that failed to load is tried
        again once its file changed (the catalog re-reads it: a download finished, a
        corrupt file replaced)."""
        berth = self._berths.get(entry.key)
        if berth is None:
            berth = self._berths[entry.key] = Berth(entry)
        elif berth.state == FAILED and (entry.mtime, entry.size_bytes) != (
            berth.entry.mtime,
            berth.entry.size_bytes,
        ):
            berth.entry, berth.state, berth.error = entry, ON_DISK, ""
        return berth

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
                if not decision.unload:  # a load's end, or anything new, plans again
                    self._cond.wait(PLAN_INTERVAL)

    def _decide(self, default_entry: Entry) -> Decision:
        """One step of the plan over a snapshot of every berth now (under the lock)."""
        now = self._clock()
        default = default_entry.key
        budget = self.placement.budget
        models = []
        for berth in self._berths.values():
            n, oldest = berth.demand
            if berth.waiting:
                n += len(berth.waiting)
                first = berth.waiting[0].since
                oldest = first if oldest is None else min(oldest, first)
            if berth.wanted:
                n, oldest = n + 1, float("-inf")
            if n and berth.state == ON_DISK and berth.key != default and berth.need() > budget:
                # It never fits, whatever is unloaded: its requests fail, saying why.
                self._loads.fail(berth, too_big(berth.need(), budget))
            models.append(
                BerthState(
                    key=berth.key,
                    need=berth.need(),
                    waiting=n,
                    oldest=oldest,
                    in_flight=berth.in_flight,
                    state=berth.state,
                    last_used=berth.last_used or 0.0,
                    pinned=berth.key == default,
                    reserved=self.placement.held(berth.key),
                    evict=berth.evict,
                )
            )
            berth.evict = False
        self._decision = self._plan.step(now, models)
        return self._decision

    def _carry_out(self, decision: Decision) -> None:
        with self._cond:
            berths: dict[Hashable, Berth] = {k: b for k, b in self._berths.items()}
        for key in decision.unload:
            self._loads.unload(berths[key])
        if decision.prefetch is not None:
            self._loads.read_ahead(berths[decision.prefetch])
        if decision.load:
            self._loads.start([berths[key] for key in decision.load])

    def _dispatch(self) -> None:
        """Send the waiting requests of every model now fed to its engine."""
        sends = []
        with self._cond:
            for berth in self._berths.values():
                if (
                    berth.key not in self._decision.active
                    or berth.engine is None
                    or not berth.waiting
                ):
                    continue
                for w in berth.waiting:
                    if not w.future.done():
                        berth.in_flight += 1
                        sends.append((berth, berth.engine, w))
                berth.waiting = []
        for berth, engine, w in sends:
            # The caller holds the waiting request's future: the engine's resolves it, and
            # cancelling it (pool.cancel) withdraws the engine's.
            inner = self._send(
                berth, engine, w.model, w.endpoint, w.body, priority=w.priority, on_chunk=w.on_chunk
            )
            _chain(inner, w.future, engine)


def _chain(inner: Future[dict[str, Any]], outer: Future[dict[str, Any]], engine: Engine) -> None:
    """The engine's future resolves the caller's; the caller's resolved first (cancelled)
    withdraws the engine's (a finished one it leaves alone)."""

    def settle(f: Future[dict[str, Any]]) -> None:
        exc = f.exception()
        resolve(outer, result=None if exc else f.result(), error=exc)

    inner.add_done_callback(settle)
    outer.add_done_callback(lambda _: engine.cancel(inner))
