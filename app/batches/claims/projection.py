"""When each running batch will finish: its projected finish time, from the rate measured
for its model's lane, the lines ahead of it and its share, and how far that was off.

The runner samples the batches in progress about once a second (one read of their rows:
the counters move by SQL on every node, so each node measures the whole queue). Batches
are grouped by their route (`Batch.route`, the model id validation resolved), as the claims
group them: `llama3` and `llama3:latest` are one model with one rate. Each
model's rate is the lines its batches finished over the last RATE_WINDOW_S seconds. The
queue is then played forward as the claims fill it (claims.py): a lane's rate shared
round-robin between owners, and within an owner between its batches in progress; when
one batch runs out of lines its share goes to the others. A batch's projected finish is
when its last line comes out of that play; the lines ahead of it are the other batches'
lines played before then.

When a batch completes, the node that finalizes it logs how far the projections made at
its start and at its half-way point were off, and keeps the figures for /metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlmodel import Session, col

from app.batches.claims.claims import NO_DEADLINE
from app.db import Database
from app.tables import Batch, BatchStatus

log = logging.getLogger("batchyard.projection")

#: The rate of a model is what its batches finished over this many recent seconds.
RATE_WINDOW_S = 60.0
#: Below this much sampled time a model's rate comes from its batches' averages instead.
MIN_SPAN_S = 1.0
#: Seconds between two samples.
SAMPLE_INTERVAL_S = 1.0
#: Completed batches whose projection errors /metrics shows, the most recent.
ERRORS_KEPT = 20
#: Batches whose first and half-way projections are remembered until they end.
HISTORY_KEPT = 1000


@dataclass(frozen=True)
class Running:
    """A batch in progress, as a sample reads it."""

    id: str
    owner: str
    #: Its batch's route: the id of the model its lines run on ("" for the default
    #: model's lines), the key its rate is measured by; None until it is validated.
    route: str | None
    total: int
    done: int
    in_progress_at: int | None
    expires_at: int | None


@dataclass(frozen=True)
class Projection:
    batch_id: str
    #: Unix seconds when its last line is projected to finish; None while no rate is known
    #: (nothing of its model finished yet, or its engine is down).
    finish_at: float | None
    #: Its completion window's end (expires_at).
    deadline: int | None
    #: Lines a second its model's lane finishes now, all batches together.
    rate: float | None
    #: Its part of that rate now (1.0: it runs alone).
    share: float
    #: Other batches' lines of its model projected to finish before its last one.
    ahead: int
    #: Unix seconds when this projection was made.
    made_at: float

    @property
    def late(self) -> bool:
        """Projected to finish after its deadline."""
        return (
            self.finish_at is not None
            and self.deadline is not None
            and self.finish_at > self.deadline
        )


@dataclass(frozen=True)
class ProjectionError:
    """How far a completed batch's projections were off: projected minus actual finish,
    in seconds (positive: it finished sooner than projected)."""

    batch_id: str
    finished_at: float
    #: The first projection made, and the one made when half its lines were done; each
    #: (error seconds, seconds it looked ahead), or None when none was made.
    first: tuple[float, float] | None
    half: tuple[float, float] | None


def play(
    remaining: Mapping[str, tuple[str, int, int | None]], rate: float
) -> dict[str, tuple[float, int]]:
    """Each batch's (seconds until its last line, lines of the others played before it),
    for batches {id: (owner, lines left, deadline)} sharing a lane that finishes `rate`
    lines a second as the claims share it (claims.py): round-robin between owners; within
    an owner, its share to its batches of the nearest deadline (expires_at; None after
    every deadline), split between them when they share it."""
    left = {b: float(n) for b, (_, n, _) in remaining.items() if n > 0}
    out = {b: (0.0, 0) for b, (_, n, _) in remaining.items() if n <= 0}
    played = dict.fromkeys(left, 0.0)
    t = 0.0
    while left:
        first: dict[str, int] = {}  # each owner's nearest deadline
        for b in left:
            owner, d = remaining[b][0], _deadline(remaining[b])
            first[owner] = min(first.get(owner, d), d)
        served = [b for b in left if _deadline(remaining[b]) == first[remaining[b][0]]]
        counts: dict[str, int] = {}
        for b in served:
            counts[remaining[b][0]] = counts.get(remaining[b][0], 0) + 1
        shares = {b: rate / len(first) / counts[remaining[b][0]] for b in served}
        step = min(left[b] / shares[b] for b in served)
        t += step
        for b in served:
            left[b] -= shares[b] * step
            played[b] += shares[b] * step
        for b in [b for b in served if left[b] <= 1e-9]:
            del left[b]
            ahead = sum(p for other, p in played.items() if other != b)
            out[b] = (t, round(ahead))
    return out


def _deadline(item: tuple[str, int, int | None]) -> int:
    return NO_DEADLINE if item[2] is None else item[2]


def share_of(batch: Running, batches: Iterable[Running]) -> float:
    """The batch's part of its lane's rate now, as the claims share it: an owner's part goes
    to its batches of the nearest deadline (0 for its others until they are done)."""
    running = [b for b in batches if b.done < b.total]
    first: dict[str, int] = {}
    for b in running:
        d = _deadline((b.owner, 0, b.expires_at))
        first[b.owner] = min(first.get(b.owner, d), d)
    if batch.owner not in first:
        return 1.0
    mine = [b for b in running if b.owner == batch.owner]
    served = [b for b in mine if _deadline((b.owner, 0, b.expires_at)) == first[b.owner]]
    if batch not in served and batch in mine:
        return 0.0
    return 1.0 / len(first) / max(1, len(served))


@dataclass
class _History:
    """What the projector remembers of one batch while it runs."""

    first: tuple[float, float] | None = None  # (made at, projected finish)
    half: tuple[float, float] | None = None


@dataclass
class Projections:
    """Samples the batches in progress and projects their finish (thread-safe: the runner
    samples, the dashboard and /metrics read)."""

    db: Database
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: Per route: (time, lines its batches finished since the projector started).
    _lines: dict[str | None, deque[tuple[float, int]]] = field(default_factory=dict)
    _cumulative: dict[str | None, int] = field(default_factory=dict)
    _last_done: dict[str, int] = field(default_factory=dict)
    _last_sample: float = float("-inf")  # monotonic
    _last_now: float = float("inf")  # the last sample's unix time
    _current: dict[str, Projection] = field(default_factory=dict)
    _at_risk: frozenset[str] = frozenset()
    _history: dict[str, _History] = field(default_factory=dict)
    errors: deque[ProjectionError] = field(default_factory=lambda: deque(maxlen=ERRORS_KEPT))

    def get(self, batch_id: str) -> Projection | None:
        with self._lock:
            return self._current.get(batch_id)

    def current(self) -> dict[str, Projection]:
        with self._lock:
            return dict(self._current)

    def at_risk(self) -> frozenset[str]:
        """The batches projected to finish after their deadline at the rate measured for
        their lane: the claims serve them ahead of fair shares, within a bound (claims.py)."""
        with self._lock:
            return self._at_risk

    def sample(self, now: float | None = None, *, force: bool = False) -> None:
        """Read the batches in progress and project them again (each SAMPLE_INTERVAL_S at
        most unless `force`)."""
        mono = time.monotonic()
        if not force and mono - self._last_sample < SAMPLE_INTERVAL_S:
            return
        self._last_sample = mono
        with self.db.read() as s:
            rows = running_batches(s)
        self.project(rows, time.time() if now is None else now)

    def project(self, rows: list[Running], now: float) -> None:
        """Project `rows` (every batch in progress) at `now`."""
        by_model: dict[str | None, list[Running]] = {}
        for r in rows:
            by_model.setdefault(r.route, []).append(r)
        with self._lock:
            for model, batches in by_model.items():
                finished = 0
                for b in batches:
                    before = self._last_done.get(b.id)
                    if before is not None:
                        finished += max(0, b.done - before)
                    elif self._last_now <= now:
                        # Not in progress at the last sample: its lines finished since.
                        finished += b.done
                    self._last_done[b.id] = b.done
                self._cumulative[model] = self._cumulative.get(model, 0) + finished
                samples = self._lines.setdefault(model, deque())
                samples.append((now, self._cumulative[model]))
                while len(samples) > 2 and samples[1][0] <= now - RATE_WINDOW_S:
                    samples.popleft()
            ids = {r.id for r in rows}
            for gone in [b for b in self._last_done if b not in ids]:
                del self._last_done[gone]
            current: dict[str, Projection] = {}
            for model, batches in by_model.items():
                rate = self._rate(model, batches, now)
                left = {b.id: (b.owner, b.total - b.done, b.expires_at) for b in batches}
                plan = play(left, rate) if rate else {}
                for b in batches:
                    ahead_s, ahead = plan.get(b.id, (0.0, 0))
                    p = Projection(
                        batch_id=b.id,
                        finish_at=now + ahead_s if rate else None,
                        deadline=b.expires_at,
                        rate=rate,
                        share=share_of(b, batches),
                        ahead=ahead,
                        made_at=now,
                    )
                    current[b.id] = p
                    self._remember(b, p)
            self._current = current
            self._at_risk = frozenset(b for b, p in current.items() if p.late)
            self._last_now = now
            # A batch's history waits for ended(), which comes after it left in_progress;
            # one that ended elsewhere (another node finalized it) goes when many have.
            while len(self._history) > HISTORY_KEPT:
                del self._history[next(iter(self._history))]

    def _rate(self, model: str | None, batches: list[Running], now: float) -> float | None:
        samples = self._lines.get(model)
        if samples and len(samples) >= 2 and samples[-1][0] - samples[0][0] >= MIN_SPAN_S:
            (t0, n0), (t1, n1) = samples[0], samples[-1]
            return (n1 - n0) / (t1 - t0) if n1 > n0 else None
        # Too soon to measure: the batches' own averages since each started.
        rates = [
            b.done / (now - b.in_progress_at)
            for b in batches
            if b.in_progress_at is not None and now - b.in_progress_at >= 1 and b.done
        ]
        return max(rates) if rates else None

    def _remember(self, b: Running, p: Projection) -> None:
        if p.finish_at is None:
            return
        h = self._history.setdefault(b.id, _History())
        if h.first is None:
            h.first = (p.made_at, p.finish_at)
        if h.half is None and b.total and b.done * 2 >= b.total:
            h.half = (p.made_at, p.finish_at)

    def ended(self, s: Session, batch: Batch) -> None:  # noqa: ARG002 - an end hook's signature
        """The runner's end hook: a completed batch's projection errors, logged and kept."""
        with self._lock:
            h = self._history.pop(batch.id, None)
            self._current.pop(batch.id, None)
            self._at_risk = self._at_risk - {batch.id}
        if batch.status != BatchStatus.COMPLETED or h is None:
            return
        actual = float(batch.finalizing_at or batch.completed_at or time.time())
        if time.time() - actual < 2:
            actual = time.time()  # finalized at its last line: finer than the row's seconds

        def off(made: tuple[float, float] | None) -> tuple[float, float] | None:
            return None if made is None else (made[1] - actual, actual - made[0])

        e = ProjectionError(batch.id, actual, off(h.first), off(h.half))
        with self._lock:
            self.errors.append(e)
        log.info(
            "batch=%s projection_error first=%s half=%s",
            batch.id,
            describe(e.first),
            describe(e.half),
        )


def describe(error: tuple[float, float] | None) -> str:
    """'+12.0s/150s' (projected 12 s late, 150 s ahead), or '-' when none was made."""
    return "-" if error is None else f"{error[0]:+.1f}s/{error[1]:.0f}s"


def running_batches(s: Session) -> list[Running]:
    rows = (
        s.connection()
        .execute(
            select(
                col(Batch.id),
                col(Batch.owner),
                col(Batch.route),
                col(Batch.total),
                col(Batch.completed) + col(Batch.failed),
                col(Batch.in_progress_at),
                col(Batch.expires_at),
            ).where(col(Batch.status) == BatchStatus.IN_PROGRESS)
        )
        .all()
    )
    return [Running(*row) for row in rows]


def seconds_left(finish_at: float | None, now: float, *, total: int, done: int) -> float | None:
    """The one estimate of how long a batch has left, which the batch list, the batch page
    and its chart, and `batchyard run`'s progress all show: its projected finish (`finish_at`,
    Projection.finish_at) from `now`. 0 once every line is done; None while none is
    projected (nothing of its model finished yet, or its engine is down)."""
    if total and done >= total:
        return 0.0
    return None if finish_at is None else max(0.0, finish_at - now)
