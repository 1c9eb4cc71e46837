"""The plan: which models the engine feeds, loads and unloads next. A pure state machine.

Its input each step is what every model looks like now (`Model`: its lines waiting and
the oldest one's time, its lines in flight, loaded or not) and the clock; its output a
`Decision`: the models whose lines may be claimed and fed (`active`), what to unload now,
what to stop feeding (`drain`), what to load and whose file to read ahead. The pool
(pool.py) carries the decisions out and keeps the placement's reservations.

The rules (issue 32):
- Models already loaded keep being fed.
- A model with waiting lines loads at once where there is room: the count
  (`max_loaded`, 0 for none) and the memory (the placement's budget).
- Otherwise it displaces loaded models only when their queues are empty, or when its own
  oldest line has waited `switch_after` seconds. Idle queues go first, then the least
  recently used. A model's lines wait from the last time it was fed at the earliest, and
  a busy model is displaced only once it has been fed `switch_after` itself: so a model
  just displaced does not swap back at once, a load slower than the bound does not swap
  models out before they run a line, and two big batches share the engine in turns of
  at least `switch_after`, not a swap per line. A displaced model is fed no more; its lines in flight finish; then it is
  unloaded and the waiting model loaded.
- A model with lines in flight is never unloaded.
- A loaded model idle (nothing waiting, nothing in flight) for `ttl` seconds is unloaded,
  unless pinned (the default model, which a one-model server keeps loaded as before).
- One load at a time: the next is planned once it is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.pool.placement import Placement

#: A model's states as the plan sees them (views add "idle": loaded, nothing in flight).
ON_DISK, LOADING, LOADED, FAILED = "on disk", "loading", "loaded", "failed"


@dataclass(frozen=True)
class Model:
    """One model at one moment, as the pool tells the plan."""

    id: str
    need: int  # bytes it would take once loaded: its estimate
    waiting: int = 0  # lines waiting for it: batch lines pending, online requests queued
    oldest: float | None = None  # when its oldest waiting line began to wait (plan clock)
    in_flight: int = 0  # lines its engine runs now
    state: str = ON_DISK
    last_used: float = 0.0
    pinned: bool = False


@dataclass(frozen=True)
class Decision:
    """What the pool does now."""

    active: frozenset[str]  # models whose lines may be claimed and fed
    unload: tuple[str, ...] = ()  # close now: nothing in flight
    drain: frozenset[str] = frozenset()  # fed no more; unloaded once their lines finish
    load: str | None = None  # load now (after the unloads)
    prefetch: str | None = None  # read this model's file ahead: it loads next


class Plan:
    """The scheduler's memory between steps: the models it is draining."""

    def __init__(
        self, placement: Placement, *, max_loaded: int, switch_after: float, ttl: float
    ) -> None:
        self.placement = placement
        self.max_loaded = max_loaded
        self.switch_after = switch_after
        self.ttl = ttl
        self.draining: set[str] = set()
        #: When each model was last fed (active): its lines' wait counts from then.
        self.last_fed: dict[str, float] = {}
        #: When each loaded model began to be fed since its load.
        self.fed_since: dict[str, float] = {}

    def step(self, now: float, models: Sequence[Model]) -> Decision:
        loaded = {m.id: m for m in models if m.state == LOADED}
        self.draining &= set(loaded)
        unload = [m.id for m in loaded.values() if m.id in self.draining and not m.in_flight]
        if self.ttl > 0:
            unload += [
                m.id
                for m in loaded.values()
                if m.id not in self.draining
                and not m.pinned
                and not m.in_flight
                and not m.waiting
                and now - m.last_used >= self.ttl
            ]
        load, prefetch = None, None
        if not any(m.state == LOADING for m in models):
            load, prefetch = self._next_load(now, models, loaded, unload)
        for m in unload:
            self.draining.discard(m)
        active = frozenset(m for m in loaded if m not in self.draining and m not in unload)
        for m in active:
            self.last_fed[m] = now
            self.fed_since.setdefault(m, now)
        for m in [m for m in self.fed_since if m not in loaded or m in unload]:
            del self.fed_since[m]
        failed = frozenset(m.id for m in models if m.state == FAILED)
        return Decision(
            # A failed model's lines are claimed too: the pool fails them with the reason.
            active=active | failed,
            unload=tuple(unload),
            drain=frozenset(self.draining),
            load=load,
            prefetch=prefetch,
        )

    def _next_load(
        self, now: float, models: Sequence[Model], loaded: dict[str, Model], unload: list[str]
    ) -> tuple[str | None, str | None]:
        """The model to load now, and the one to read ahead: the next in line, so that its
        file is in the page cache by its turn (a cold read of a 1 B model's file took
        seconds, a warm load under one)."""
        waiters = sorted(
            (m for m in models if m.waiting and m.state == ON_DISK),
            key=lambda m: (self._waited_since(m, now), m.id),
        )
        for cand in waiters:
            staying = [m for m in loaded.values() if m.id not in unload]
            if self._room(cand, staying, unload):
                return cand.id, _next_after(waiters, cand)
            going = set(self.draining)
            if self._room(cand, [m for m in staying if m.id not in going], unload + list(going)):
                return None, cand.id  # the drained models' lines are finishing
            overdue = now - self._waited_since(cand, now) >= self.switch_after
            # Idle queues first, then the least recently used.
            movable = sorted(
                (
                    m
                    for m in staying
                    if m.id not in going
                    and (not m.waiting or (overdue and self._had_its_turn(m, now)))
                ),
                key=lambda m: (m.waiting > 0, m.last_used, m.id),
            )
            chosen: list[Model] = []
            for m in movable:
                chosen.append(m)
                keep = [s for s in staying if s.id not in going and s not in chosen]
                if self._room(cand, keep, unload + list(going) + [c.id for c in chosen]):
                    break
            else:
                continue  # not enough to displace for this one; maybe for the next
            for m in chosen:
                if m.in_flight:
                    self.draining.add(m.id)
                else:
                    unload.append(m.id)
            if any(m.in_flight for m in chosen) or going:
                return None, cand.id
            return cand.id, _next_after(waiters, cand)
        # Nothing loads now: the model waiting longest is likely the next.
        return None, waiters[0].id if waiters else None

    def _had_its_turn(self, m: Model, now: float) -> bool:
        """Whether a busy model has been fed `switch_after` since it loaded."""
        return now - self.fed_since.get(m.id, now) >= self.switch_after

    def _waited_since(self, m: Model, now: float) -> float:
        """Since when the model's lines have waited: their oldest, or the last time it was
        fed if that is later."""
        oldest = m.oldest if m.oldest is not None else now
        return max(oldest, self.last_fed.get(m.id, oldest))

    def _room(self, cand: Model, staying: list[Model], freed: list[str]) -> bool:
        """Whether `cand` fits beside `staying`, once the `freed` models' bytes are back."""
        if self.max_loaded and len(staying) + 1 > self.max_loaded:
            return False
        gone = set(freed)
        back = sum(r.bytes for m, r in self.placement.reservations.items() if m in gone)
        return self.placement.fits(cand.need - back)


def _next_after(waiters: list[Model], cand: Model) -> str | None:
    """The model waiting longest after `cand`."""
    rest = [m.id for m in waiters if m.id != cand.id]
    return rest[0] if rest else None
