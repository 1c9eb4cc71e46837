"""The queue's health: how many lines wait for each engine and each owner, and how long the
oldest has waited, for /metrics and the engines page.

Read at the moment it is asked for, with one grouped query over the lines waiting to be
claimed (pending, in a batch in progress), grouped by their batch's route and owner; each
route is then given to the lane that claims it (the claims' rule), so a line counts for the
engine that will run it, and a line no lane here takes now (its model is not loaded, or only
another node holds it) counts as `unrouted`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import func
from sqlmodel import col, select

from app.batches.claims.claims import lane_takes
from app.db import Database
from app.engine.node import UNROUTED, Lane
from app.tables import Batch, BatchStatus, Request, RequestStatus


@dataclass
class QueueHealth:
    """Lines waiting to be claimed: per engine (every lane, 0 included) and per owner."""

    pending_by_engine: dict[str, int] = field(default_factory=dict)
    #: Seconds since the batch of each engine's oldest waiting line was created (0: none).
    oldest_by_engine: dict[str, float] = field(default_factory=dict)
    pending_by_owner: dict[str, int] = field(default_factory=dict)


def lane_of(route: str | None, lanes: list[Lane]) -> str:
    """The lane that claims a batch's lines, by its route (claims.lane_takes): a lane of
    named routes before one that takes every line."""
    for lane in sorted(lanes, key=lambda lane: lane.models is None):
        if lane_takes(lane.models, route):
            return lane.name
    return UNROUTED


def queue_health(db: Database, lanes: list[Lane], now: float | None = None) -> QueueHealth:
    """The waiting lines counted now, in one grouped query."""
    in_progress = select(Batch.id).where(Batch.status == BatchStatus.IN_PROGRESS)
    with db.read() as s:
        rows = s.exec(
            select(Batch.route, Batch.owner, func.count(), func.min(Batch.created_ns))
            .select_from(Request)
            .join(Batch, col(Batch.id) == col(Request.batch_id))
            .where(
                # Through the batches (a subquery), so the planner uses the lines'
                # (batch_id, status) index instead of scanning every line.
                col(Request.batch_id).in_(in_progress),
                Request.status == RequestStatus.PENDING,
            )
            .group_by(col(Batch.route), col(Batch.owner))
        ).all()
    t = time.time() if now is None else now
    health = QueueHealth(
        pending_by_engine={lane.name: 0 for lane in lanes},
        oldest_by_engine={lane.name: 0.0 for lane in lanes},
    )
    for route, owner, count, oldest_ns in rows:
        engine = lane_of(route, lanes)
        health.pending_by_engine[engine] = health.pending_by_engine.get(engine, 0) + count
        age = max(0.0, t - oldest_ns / 1e9)
        health.oldest_by_engine[engine] = max(health.oldest_by_engine.get(engine, 0.0), age)
        health.pending_by_owner[owner] = health.pending_by_owner.get(owner, 0) + count
    return health


__all__ = ["QueueHealth", "lane_of", "queue_health"]
