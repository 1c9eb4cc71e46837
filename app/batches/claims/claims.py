"""Claims: the pending lines a node takes next, engine by engine.

Each engine behind a node has a lane (`Lane` in engine/registry.py): the lines whose route
it serves (a model it feeds now, or the default model's lines). A claim gives each
lane its own room, `Lane.depth` times the engine's slots (twice for the embedded engine,
four times for an upstream) less the lines it holds already; a lane whose
engine is down (`Lane.up` false) takes none, and its lines wait for it. So a big batch for
one engine never keeps the lines of another engine waiting while that engine has room, and
no engine holds more than its room. A node with one engine has one lane that takes every line.

Fair shares, earliest deadline first within them: a lane's room is filled round-robin
between owners (API keys); within an owner, the batch whose deadline (`expires_at`, which
its completion window sets) is nearest goes first, batches of one deadline take turns, and
inside a batch the oldest line goes first. Each candidate line gets its turn in one
statement with two window functions: its rank inside its batch (by line), then its rank
among its owner's lines (by its batch's deadline, that rank, then the batch's age); the
claim takes the lowest turns, the older batch first on a tie. So a 10-line batch created
behind a 50,000-line one of another key starts at the next claim, and a key's 1-hour batch
goes ahead of its own 24-hour one. Each node shares its own room this way.

At risk, ahead of shares, within a bound: a batch that its projection
(projection.py: the rate measured for its model's lane, played forward under these
shares) says will finish after its deadline is at risk. A claim first fills up to half of
each lane's room (RISK_SHARE of `room()`'s whole room, the lines of at-risk batches the
lane holds already counted against it) with at-risk batches' lines, in the same turns
(owners round-robin, nearest deadline first), then the rest of the room by fair shares
as above, where the at-risk batches take their turns too. So at least half of every
lane's room still goes by fair shares: every owner keeps at least half the share it
would have had, and none stops while another's batch is late.

An upstream lane with `priority=on` gives each line it claims vLLM's and SGLang's
`priority` (lower runs sooner), from its batch's deadline: line_priority.

A line is routed by its batch's `route`: validation refuses a batch whose lines name
different models (`mismatched_model`) and resolves the one they name, once, to the id of
the model that runs them (app/batches/lifecycle/validate.py: ModelRules.route), so the batch row says where each of its
lines goes without reading the input file, and the query filters on it with the ids the
lanes take at this moment. A line whose model is known but that no lane takes waits for
its model: it is never given to another.

One write transaction (the caller's) claims for every lane: BEGIN IMMEDIATE on SQLite; on PostgreSQL each
lane's SELECT locks only its request rows, FOR UPDATE SKIP LOCKED, so several nodes never
take one line and never wait on each other.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    func,
    or_,
    union_all,
    update,
)
from sqlalchemy import select as select_columns
from sqlalchemy.sql.selectable import CTE, Subquery
from sqlmodel import Session, col

from app.engine.node import Lane
from app.tables import Batch, BatchStatus, Request, RequestStatus

#: A line whose claim ran out this many times (the server died while running it) fails
#: instead of taking the server down again.
MAX_ATTEMPTS = 3
#: How far into each batch a lane's claim looks, in times its room (_claim_lane).
LOOK_AHEAD = 4
#: The deadline the claim gives a batch without one: after every real one (unix seconds).
NO_DEADLINE = 2**62
#: line_priority of a batch without a deadline: after a 7-day window's.
NO_DEADLINE_PRIORITY = 15
#: The most of a lane's room that at-risk batches take ahead of fair shares.
RISK_SHARE = 0.5


@dataclass
class Claim:
    """One line this node now holds, for the runner to hand to its engine: plain values
    from the claim's own SELECT, no ORM object (the claim is on every line's path)."""

    request_id: str
    batch_id: str
    offset: int
    length: int
    #: Its attempts, this one included.
    attempts: int
    endpoint: str
    input_file_id: str
    lane: str
    #: Its attempts are used up: it is failed without running.
    exhausted: bool = False
    #: Its batch's route: the id of the model it runs on ("" for the default model's
    #: lines; None for a batch not routed yet, on a node with one engine).
    route: str | None = None
    #: The `priority` its engine is sent (a lane with `priority=on`), else None.
    priority: int | None = None


def line_priority(expires_at: int | None, now: float) -> int:
    """vLLM's and SGLang's `priority` for a batch line (lower runs sooner): k while the
    minutes left to its batch's deadline are under 2**k, and 1 under 2 minutes (or past
    it): 6 for a 1-hour window at its start, 11 for 24 hours, 14 for 7 days; 15 without a
    deadline. Never 0, which online requests have by sending none: the engine serves them
    first."""
    if expires_at is None:
        return NO_DEADLINE_PRIORITY
    minutes = int(max(0.0, expires_at - now) // 60)
    return max(1, minutes.bit_length())


def room(lane: Lane, held: int) -> int:
    """How many more lines the lane's engine may take: its queue a little ahead of its
    slots, so no slot idles between lines, and no more, so the rest stays for other nodes."""
    return max(2, lane.slots * lane.depth) - held


def risk_room(lane: Lane, held_at_risk: int) -> int:
    """How many more lines of at-risk batches the lane may take ahead of fair shares:
    RISK_SHARE of its whole room (at least one line) less those it holds."""
    return max(1, int(room(lane, 0) * RISK_SHARE)) - held_at_risk


def lane_takes(routes: frozenset[str] | None, route: str | None) -> bool:
    """Whether a lane whose routes are `routes` (`Lane.models`) claims the lines of a batch
    routed to `route`: every line with None, else a batch whose route is one of them. The
    claim's SQL (`_routed`) says the same; a test plays both on the same batches."""
    return routes is None or (route is not None and route in routes)


def _routed(routes: frozenset[str] | None) -> ColumnElement[bool] | None:
    """The WHERE clause of a lane's lines (`Lane.models`), or None for every line: the SQL
    of `lane_takes`."""
    if routes is None:
        return None
    return col(Batch.route).in_(sorted(routes))


def waiting_lines(s: Session) -> list[tuple[str | None, int, float]]:
    """The lines of the batches in progress that wait for a claim, by the batch's route:
    (route, lines, when the oldest began to wait: its batch's start), for the model pool's
    plan. Pending lines, and running ones whose lease ran out (a node died holding them),
    which `claim` takes as well: without them a batch whose last lines a dead node held
    waited for a model that no pending line asked to load. One GROUP BY over the
    (batch_id, status, line) index."""
    rows = s.connection().execute(
        select_columns(
            col(Batch.route),
            func.count(col(Request.id)),
            func.min(func.coalesce(col(Batch.in_progress_at), col(Batch.created_at))),
        )
        .join(Request, col(Request.batch_id) == col(Batch.id))
        .where(
            col(Batch.status) == BatchStatus.IN_PROGRESS,
            or_(
                col(Request.status) == RequestStatus.PENDING,
                and_(
                    col(Request.status) == RequestStatus.RUNNING,
                    col(Request.lease_until) < time.time(),
                ),
            ),
        )
        .group_by(col(Batch.route))
    )
    return [(route, int(n), float(oldest)) for route, n, oldest in rows]


def claim(
    s: Session,
    lanes: list[Lane],
    held: Mapping[str, int],
    inflight: Container[str],
    *,
    worker_id: str,
    lease_seconds: float,
    at_risk: Collection[str] = frozenset(),
    held_at_risk: Mapping[str, int] | None = None,
) -> list[Claim]:
    """Claim up to each lane's room of its oldest pending lines (or lines whose lease ran
    out); `held` counts the lines each lane holds now, `inflight` names them. Lines of the
    batches `at_risk` go first into each lane's risk_room (`held_at_risk`: those of their
    lines each lane holds now).

    One SELECT per lane finds (and on PostgreSQL locks) the lines, and one UPDATE by their
    ids takes them all: a line already used up keeps its attempts and is failed by the
    runner. It runs in the caller's write transaction: the runner's step records the
    results that came back and claims into the room they left in one commit."""
    # A lane whose engine is down claims nothing; it still keeps its lines from the others.
    rooms = [(lane, room(lane, held.get(lane.name, 0))) for lane in lanes if lane.up]
    rooms = [(lane, n) for lane, n in rooms if n > 0]
    if not rooms:
        return []
    t = time.time()
    claims: list[Claim] = []
    conn = s.connection()
    risky = sorted(at_risk)
    take = {"worker_id": worker_id, "claimed_at": int(t), "lease_until": t + lease_seconds}
    fair: list[Claim] = []
    for lane, n in rooms:
        ahead = min(n, risk_room(lane, (held_at_risk or {}).get(lane.name, 0)))
        if risky and ahead > 0:
            first = _claim_lane(
                conn, lane, ahead, held.get(lane.name, 0), inflight=inflight, t=t, only=risky
            )
            if first:
                # Taken before the fair shares' turns are counted, so that these lines are
                # no longer pending there: the at-risk batches' turns start after them.
                conn.execute(_TAKE, {"ids": [c.request_id for c in first], **take})
                claims += first
                n -= len(first)
        if n > 0:
            fair += _claim_lane(conn, lane, n, held.get(lane.name, 0), inflight=inflight, t=t)
    if fair:
        conn.execute(_TAKE, {"ids": [c.request_id for c in fair], **take})
    return claims + fair


#: The claim's UPDATE, built once (it runs every step; building it cost more than running it).
_TAKE = (
    update(Request)
    .where(col(Request.id).in_(bindparam("ids", expanding=True)))
    .values(
        status=RequestStatus.RUNNING,
        claimed_by=bindparam("worker_id"),
        claimed_at=bindparam("claimed_at"),
        lease_until=bindparam("lease_until"),
        attempts=case(
            (col(Request.attempts) >= MAX_ATTEMPTS, col(Request.attempts)),
            else_=col(Request.attempts) + 1,
        ),
    )
)


def _claim_lane(
    conn: Connection,
    lane: Lane,
    n: int,
    held: int,
    *,
    inflight: Container[str],
    t: float,
    only: list[str] | None = None,
) -> list[Claim]:
    # Lines this node holds whose lease lapsed may come back: the LIMIT looks past them.
    # The look into each batch's pending lines is a few times the room alone: the lines
    # this node holds are running, not pending, so they take no place in it. `only`: the
    # batches it may take lines of (the at-risk ones), else any.
    wanted = n + held
    params: dict[str, Any] = {"look": LOOK_AHEAD * n, "lapsed": t, "wanted": wanted}
    if only is not None:
        params["only"] = only
    rows = conn.execute(_claim_query(lane.models, only is not None), params).all()
    claims = []
    for request_id, batch_id, offset, length, attempts, endpoint, file_id, route, dl in rows:
        if request_id in inflight:
            continue
        exhausted = attempts >= MAX_ATTEMPTS
        claims.append(
            Claim(
                request_id,
                batch_id,
                offset,
                length,
                attempts if exhausted else attempts + 1,
                endpoint,
                file_id,
                lane.name,
                exhausted,
                route,
                line_priority(dl, t) if lane.priority else None,
            )
        )
        if len(claims) == n:
            break
    return claims


@functools.lru_cache(maxsize=64)
def _claim_query(
    routes: frozenset[str] | None, some: bool = False
) -> Select[str, str, int, int, int, str, str, str | None, int | None]:
    """A lane's claim SELECT, built once for each set of routes (a lane's change only when
    the pool feeds another model or an upstream's /v1/models changes): built every step, it took longer in SQLAlchemy
    than in the database (bench/fleet.py). Its parameters: `look`, how far into each batch
    it looks; `lapsed`, the time before which a lease has run out; `wanted`, its LIMIT;
    with `some`, `only`: the ids of the batches it takes lines of."""
    turns = _turns(_candidates(_lane_batches(routes, some)))
    return (
        select_columns(
            col(Request.id),
            col(Request.batch_id),
            col(Request.offset),
            col(Request.length),
            col(Request.attempts),
            col(Batch.endpoint),
            col(Batch.input_file_id),
            col(Batch.route),
            col(Batch.expires_at),
        )
        .select_from(Request)
        .join(turns, turns.c.id == col(Request.id))
        .join(Batch, col(Batch.id) == col(Request.batch_id))
        .order_by(turns.c.turn, turns.c.created_ns, turns.c.line)
        .limit(bindparam("wanted", type_=Integer))
        # Several nodes on one PostgreSQL queue never claim the same line; only the request
        # rows are locked, so recording results for the batch goes on (SQLite has one
        # writer at a time and leaves the clause out).
        .with_for_update(skip_locked=True, of=Request)
    )


def _lane_batches(routes: frozenset[str] | None, some: bool) -> CTE:
    """The claim's first part, `b`: the lane's batches in progress (with `some`, those of
    `only`), each with its owner, age, deadline and first pending line."""
    where = _routed(routes)
    # The lane's batches in progress, each with its first pending line (one short look
    # into the (batch_id, status, line) index per batch).
    first_pending = (
        select_columns(func.min(col(Request.line)))
        .where(
            col(Request.batch_id) == col(Batch.id),
            col(Request.status) == RequestStatus.PENDING,
        )
        .scalar_subquery()
    )
    batches = select_columns(
        col(Batch.id).label("id"),
        col(Batch.owner).label("owner"),
        col(Batch.created_ns).label("created_ns"),
        # A batch without a deadline (none is made so) comes after every one with one.
        func.coalesce(col(Batch.expires_at), NO_DEADLINE).label("deadline"),
        first_pending.label("first"),
    ).where(col(Batch.status) == BatchStatus.IN_PROGRESS)
    if where is not None:
        batches = batches.where(where)
    if some:
        batches = batches.where(col(Batch.id).in_(bindparam("only", expanding=True)))
    # A CTE, not a subquery: PostgreSQL inlined the subquery and ran the first-pending look
    # again for every candidate row (EXPLAIN: 512 loops a claim); read twice below, the
    # CTE is computed once.
    return batches.cte("b")


def _lines(b: CTE, k: ColumnElement[int]) -> Select[Any]:
    """The columns a candidate line carries: its id, its batch's owner, creation and
    deadline, its line number and `k`, how far into its batch it is."""
    return select_columns(
        col(Request.id).label("id"),
        b.c.owner,
        b.c.created_ns,
        b.c.deadline,
        col(Request.line).label("line"),
        k.label("k"),
    ).join(b, b.c.id == col(Request.batch_id))


def _candidates(b: CTE) -> Subquery:
    """The claim's second part: the lines it may take of the batches `b`."""
    # Each batch's candidates: its pending lines from the first on, no further than a few
    # times the lane's room (no batch gives one claim more, and on PostgreSQL other nodes
    # may hold the first ones: SKIP LOCKED then takes the next), and any line whose lease
    # ran out (a node died holding it). `k`: how far into its batch a line is.
    pending = _lines(b, col(Request.line) - b.c.first).where(
        col(Request.status) == RequestStatus.PENDING,
        col(Request.line) < b.c.first + bindparam("look", type_=Integer),
    )
    lapsed = _lines(b, col(Request.line) - func.coalesce(b.c.first, col(Request.line))).where(
        col(Request.status) == RequestStatus.RUNNING,
        col(Request.lease_until) < bindparam("lapsed", type_=Float),
    )
    return union_all(pending, lapsed).subquery("candidates")


def _turns(candidates: Subquery) -> Subquery:
    """The claim's third part: each candidate line's turn (the deadline and fair-share
    order)."""
    # A line's turn: its rank among its owner's lines, by its batch's deadline, then how far
    # into its batch it is, then the batch's age. Owners take turns; within an owner the
    # batch whose deadline is nearest goes first, and batches of one deadline take turns.
    return select_columns(
        candidates.c.id,
        candidates.c.created_ns,
        candidates.c.line,
        func.row_number()
        .over(
            partition_by=candidates.c.owner,
            order_by=(
                candidates.c.deadline,
                candidates.c.k,
                candidates.c.created_ns,
                candidates.c.line,
            ),
        )
        .label("turn"),
    ).subquery("turns")
