"""The plan: which models the engine feeds, loads and unloads next. A pure state machine.

Its input each step is what every model looks like now (`BerthState`: its requests waiting
(batch lines and online requests) and the oldest one's time, its requests running, loaded or
not, the bytes its reservation holds) and the clock; its output a `Decision`: the models
whose lines may be claimed and fed (`active`), what to unload now, what to stop feeding
(`drain`), what to load and whose file to read ahead. The pool (pool.py) carries the decisions out; nothing but `step`
changes the plan's memory (the models it drains, when each was fed).

The rules (issue 32):
- Models already loaded keep being fed.
- A model with waiting lines loads at once where it fits: the count
  (`max_loaded`, 0 for none) and the memory (`budget`, less the bytes reserved).
- Otherwise it displaces loaded models only when their queues are empty, or when its own
  oldest line has waited `switch_after` seconds. Idle queues go first, then the least
  recently used. A model's lines wait from the last time it was fed at the earliest, and
  a busy model is displaced only once it has been fed `switch_after` itself: so a model
  just displaced does not swap back at once, a load slower than the bound does not swap
  models out before they run a line, and two big batches share the engine in turns of
  at least `switch_after`, not a swap per line. A displaced model is fed no more; its
  requests in flight finish; then it is unloaded and the waiting model loaded.
- A model with requests in flight is never unloaded.
- A loaded model idle (nothing waiting, nothing in flight) for `ttl` seconds is unloaded,
  unless pinned (the default model, which a one-model server keeps loaded as before).
- Loads side by side where the budget holds them (issue 39): when every model waiting on disk
  fits beside those loaded and loading, all of them load at once, beside any load under
  way. Otherwise one load at a time: the next is planned once it is done.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

#: A model's states as the plan sees them (views add "idle": loaded, nothing in flight).
ON_DISK, LOADING, LOADED, FAILED = "on disk", "loading", "loaded", "failed"


@dataclass(frozen=True)
class BerthState:
    """One model at one moment, as the pool tells the plan."""

    key: Hashable  # the berth's key (pool.py: the catalog entry's `key`)
    need: int  # bytes it would take once loaded: measured at its last load, else estimated
    waiting: int = 0  # requests waiting for it: batch lines pending, online requests queued
    oldest: float | None = None  # when its oldest waiting request began to wait (plan clock)
    in_flight: int = 0  # requests its engine runs now (batch lines and online requests)
    state: str = ON_DISK
    last_used: float = 0.0
    pinned: bool = False
    reserved: int = 0  # bytes of the budget it holds now (loaded or loading), else 0
    evict: bool = False  # unload it now if nothing is in flight (the dashboard's button)


@dataclass(frozen=True)
class Decision:
    """What the pool does now."""

    active: frozenset[Hashable]  # models whose lines may be claimed and fed
    unload: tuple[Hashable, ...] = ()  # close now: nothing in flight
    #: Fed no more; unloaded once their lines finish. A batch line claimed just before its
    #: model joined these still runs on it (pool.submit).
    drain: frozenset[Hashable] = frozenset()
    load: tuple[Hashable, ...] = ()  # load now (after the unloads), side by side
    prefetch: Hashable | None = None  # read this model's file ahead: it loads next


class Plan:
    """The scheduler's rules and its memory between steps: the models it drains and when
    each was fed. Only `step` changes that memory."""

    def __init__(self, *, budget: int, max_loaded: int, switch_after: float, ttl: float) -> None:
        self.budget = budget
        self.max_loaded = max_loaded
        self.switch_after = switch_after
        self.ttl = ttl
        self._draining: set[Hashable] = set()
        #: When each model was last fed (active): its lines' wait counts from then.
        self._last_fed: dict[Hashable, float] = {}
        #: When each loaded model began to be fed since its load.
        self._fed_since: dict[Hashable, float] = {}

    def step(self, now: float, models: Sequence[BerthState]) -> Decision:
        loaded = {m.key: m for m in models if m.state == LOADED}
        self._draining &= set(loaded)
        unload = [
            m.key
            for m in loaded.values()
            if (m.key in self._draining or m.evict) and not m.in_flight
        ]
        if self.ttl > 0:
            unload += [
                m.key
                for m in loaded.values()
                if m.key not in unload
                and m.key not in self._draining
                and not m.pinned
                and not m.in_flight
                and not m.waiting
                and now - m.last_used >= self.ttl
            ]
        load, prefetch = self._next_loads(now, models, loaded, unload)
        for m in unload:
            self._draining.discard(m)
        active = frozenset(m for m in loaded if m not in self._draining and m not in unload)
        for m in active:
            self._last_fed[m] = now
            self._fed_since.setdefault(m, now)
        for m in [m for m in self._fed_since if m not in loaded or m in unload]:
            del self._fed_since[m]
        failed = frozenset(m.key for m in models if m.state == FAILED)
        return Decision(
            # A failed model's lines are claimed too: the pool fails them with the reason.
            active=active | failed,
            unload=tuple(unload),
            drain=frozenset(self._draining),
            load=load,
            prefetch=prefetch,
        )

    def _next_loads(
        self,
        now: float,
        models: Sequence[BerthState],
        loaded: dict[Hashable, BerthState],
        unload: list[Hashable],
    ) -> tuple[tuple[Hashable, ...], Hashable | None]:
        """The models to load now, and the one to read ahead: the next in line, so that its
        file is in the page cache by its turn (a cold read of a 1 B model's file took
        seconds, a warm load under one)."""
        waiters = sorted(
            (m for m in models if m.waiting and m.state == ON_DISK),
            key=lambda m: (self._waited_since(m, now), repr(m.key)),
        )
        reserved = sum(m.reserved for m in models)
        loading = [m for m in models if m.state == LOADING]
        staying = [m for m in loaded.values() if m.key not in unload]
        if waiters and self._fits(waiters, staying + loading, reserved, unload, models):
            return tuple(m.key for m in waiters), None  # all of them, side by side
        if loading:
            return (), None  # one at a time: the next is planned once this one is done
        for cand in waiters:
            if self._fits([cand], staying, reserved, unload, models):
                return (cand.key,), _next_after(waiters, cand)
            going = set(self._draining)
            keep = [m for m in staying if m.key not in going]
            if self._fits([cand], keep, reserved, unload + list(going), models):
                return (), cand.key  # the drained models' lines are finishing
            overdue = now - self._waited_since(cand, now) >= self.switch_after
            # Idle queues first, then the least recently used.
            movable = sorted(
                (m for m in keep if not m.waiting or (overdue and self._had_its_turn(m, now))),
                key=lambda m: (m.waiting > 0, m.last_used, repr(m.key)),
            )
            chosen: list[BerthState] = []
            for m in movable:
                chosen.append(m)
                rest = [s for s in keep if s not in chosen]
                freed = unload + list(going) + [c.key for c in chosen]
                if self._fits([cand], rest, reserved, freed, models):
                    break
            else:
                continue  # not enough to displace for this one; maybe for the next
            for m in chosen:
                if m.in_flight:
                    self._draining.add(m.key)
                else:
                    unload.append(m.key)
            if any(m.in_flight for m in chosen) or going:
                return (), cand.key
            return (cand.key,), _next_after(waiters, cand)
        # Nothing loads now: the model waiting longest is likely the next.
        return (), waiters[0].key if waiters else None

    def _had_its_turn(self, m: BerthState, now: float) -> bool:
        """Whether a busy model has been fed `switch_after` since it loaded."""
        return now - self._fed_since.get(m.key, now) >= self.switch_after

    def _waited_since(self, m: BerthState, now: float) -> float:
        """Since when the model's lines have waited: their oldest, or the last time it was
        fed if that is later."""
        oldest = m.oldest if m.oldest is not None else now
        return max(oldest, self._last_fed.get(m.key, oldest))

    def _fits(
        self,
        cands: list[BerthState],
        staying: list[BerthState],
        reserved: int,
        freed: list[Hashable],
        models: Sequence[BerthState],
    ) -> bool:
        """Whether `cands` fit beside `staying`, once the `freed` models' bytes are back."""
        if self.max_loaded and len(staying) + len(cands) > self.max_loaded:
            return False
        gone = set(freed)
        back = sum(m.reserved for m in models if m.key in gone)
        return reserved - back + sum(c.need for c in cands) <= self.budget


def _next_after(waiters: list[BerthState], cand: BerthState) -> Hashable | None:
    """The model waiting longest after `cand`."""
    rest = [m.key for m in waiters if m.key != cand.key]
    return rest[0] if rest else None
