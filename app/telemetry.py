"""What /metrics reports: HTTP request timings, database counts, engine figures, as text.

Prometheus' text exposition format (version 0.0.4) is written by hand: a few counters,
gauges and one histogram need no client library. The HTTP figures live in a
`RequestMetrics` per app (not a process-wide registry), so apps made in one process
(tests) never mix their numbers.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func
from sqlmodel import col, select

from app import __version__
from app.batches.claims.health import QueueHealth, queue_health
from app.batches.claims.projection import Projection, ProjectionError, Projections
from app.batches.nodes import unserved_lines
from app.db import Database
from app.engine.node import EngineView, ModelView, lanes, members, model_pool
from app.tables import Batch, BatchStatus, Request, RequestStatus

if TYPE_CHECKING:
    from app.engine.base import Engine, EngineStats
    from app.engine.node import UpstreamStatus

#: Upper bounds of the latency histogram's buckets, in seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_STATUSES = (*BatchStatus.ACTIVE, *BatchStatus.FINISHED)
LINE_STATUSES = (RequestStatus.PENDING, RequestStatus.RUNNING, *RequestStatus.DONE)


class RequestMetrics:
    """HTTP requests by method, route and status, and their latency histogram by route."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str, int], int] = {}
        # (method, route) -> [per-bucket counts..., +Inf count], sum of seconds
        self.histograms: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            key = (method, route, status)
            self.counts[key] = self.counts.get(key, 0) + 1
            counts, total = self.histograms.setdefault(
                (method, route), ([0] * (len(self.buckets) + 1), [0.0])
            )
            counts[bisect.bisect_left(self.buckets, seconds)] += 1
            total[0] += seconds

    def render(self) -> list[str]:
        with self._lock:
            counts = dict(self.counts)
            hists = {k: (list(c), t[0]) for k, (c, t) in self.histograms.items()}
        out = [
            "# HELP batchyard_http_requests_total HTTP requests served, by method, route and status.",
            "# TYPE batchyard_http_requests_total counter",
        ]
        for (method, route, status), n in sorted(counts.items()):
            labels = _labels(method=method, route=route, status=str(status))
            out.append(f"batchyard_http_requests_total{labels} {n}")
        out += [
            "# HELP batchyard_http_request_duration_seconds Time to serve an HTTP request, by route.",
            "# TYPE batchyard_http_request_duration_seconds histogram",
        ]
        for (method, route), (per_bucket, total) in sorted(hists.items()):
            running = 0
            for bound, n in zip(self.buckets, per_bucket, strict=False):
                running += n
                labels = _labels(method=method, route=route, le=_number(bound))
                out.append(f"batchyard_http_request_duration_seconds_bucket{labels} {running}")
            running += per_bucket[-1]
            labels = _labels(method=method, route=route, le="+Inf")
            out.append(f"batchyard_http_request_duration_seconds_bucket{labels} {running}")
            base = _labels(method=method, route=route)
            out.append(f"batchyard_http_request_duration_seconds_sum{base} {_number(total)}")
            out.append(f"batchyard_http_request_duration_seconds_count{base} {running}")
        return out


def count_by_status(db: Database) -> tuple[dict[str, int], dict[str, int]]:
    """(batches by status, batch lines by status), counted in the database."""
    with db.read() as s:
        batches = s.exec(select(Batch.status, func.count()).group_by(col(Batch.status))).all()
        lines = s.exec(select(Request.status, func.count()).group_by(col(Request.status))).all()
    return dict(batches), dict(lines)


def running_by_node(db: Database) -> dict[str, int]:
    """Running batch lines by the node holding their claim."""
    with db.read() as s:
        rows = s.exec(
            select(Request.claimed_by, func.count())
            .where(col(Request.status) == RequestStatus.RUNNING)
            .group_by(col(Request.claimed_by))
        ).all()
    return {str(n): c for n, c in rows}


@dataclass(frozen=True)
class Figures:
    """Everything one /metrics page reports, read once: the database's counts (all nodes),
    and this node's engine and runner."""

    node: str
    engine: Engine | None
    engine_failure: str | None
    in_flight: int
    batches: dict[str, int]
    lines: dict[str, int]
    running: dict[str, int]
    stats: EngineStats | None
    views: list[EngineView]
    health: QueueHealth
    #: The model pool's views and (reserved, budget) bytes; empty and None without one.
    models: list[ModelView] = field(default_factory=list)
    memory: tuple[int, int] | None = None
    #: Lines waiting for a model no live node serves now, by that model's id (all nodes).
    unserved: dict[str, int] = field(default_factory=dict)
    #: Each batch in progress's projection, and the errors of the last ones completed here.
    projections: dict[str, Projection] = field(default_factory=dict)
    projection_errors: list[ProjectionError] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.engine is not None:
            return "ready"
        return "failed" if self.engine_failure else "starting"

    def info_labels(self) -> dict[str, str]:
        labels = {"version": __version__, "node": self.node}
        if self.engine is not None:
            labels |= {"model": self.engine.info.id, "backend": self.engine.info.backend}
        return labels

    def stat(self, value: Callable[[EngineStats], float]) -> float:
        """An engine figure, 0 while there is no engine."""
        return value(self.stats) if self.stats is not None else 0


Samples = Iterable[tuple[str, Any]]  # (labels, value)


@dataclass(frozen=True)
class Family:
    """One metric family: its name, kind, help text and how its samples are read."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: Callable[[Figures], Samples]

    def render(self, f: Figures) -> list[str]:
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} {self.kind}",
            *(f"{self.name}{labels} {_number(value)}" for labels, value in self.samples(f)),
        ]


def _one(value: Callable[[Figures], Any]) -> Callable[[Figures], Samples]:
    """A family of one sample without labels."""
    return lambda f: [("", value(f))]


def _each_engine(value: Callable[[EngineView], Any]) -> Callable[[Figures], Samples]:
    """A family of one sample per engine, labelled by its name."""
    return lambda f: [(_labels(engine=v.name), value(v)) for v in f.views]


def _each_upstream(value: Callable[[UpstreamStatus], Any]) -> Callable[[Figures], Samples]:
    """A family of one sample per upstream engine, labelled by its name."""
    return lambda f: [(_labels(engine=v.name), value(v.upstream)) for v in f.views if v.upstream]


def _each_model(value: Callable[[ModelView], Any]) -> Callable[[Figures], Samples]:
    """A family of one sample per model of the pool, labelled by its id; a model whose
    `value` is None (never loaded) has no sample."""
    return lambda f: [
        (_labels(model=v.entry.id), x) for v in f.models if (x := value(v)) is not None
    ]


def _memory(part: int) -> Callable[[Figures], Samples]:
    """The pool's reserved bytes (0) or budget (1); no sample without a pool."""
    return lambda f: [("", f.memory[part])] if f.memory is not None else []


def _each_projection(value: Callable[[Projection], Any]) -> Callable[[Figures], Samples]:
    """A family of one sample per batch in progress, labelled by its id; a batch whose
    `value` is None (no rate known yet) has no sample."""
    return lambda f: [
        (_labels(batch=b), x)
        for b, p in sorted(f.projections.items())
        if (x := value(p)) is not None
    ]


def _projection_errors(f: Figures) -> Samples:
    out = []
    for e in f.projection_errors:
        for at, error in (("first", e.first), ("half", e.half)):
            if error is not None:
                out.append((_labels(batch=e.batch_id, at=at), error[0]))
    return out


def _by(label: str, counts: Callable[[Figures], dict[str, Any]]) -> Callable[[Figures], Samples]:
    """A family of one sample per key of `counts`, in key order."""
    return lambda f: [(_labels(**{label: k}), n) for k, n in sorted(counts(f).items())]


#: The /metrics page, family by family, in the order it is written.
FAMILIES: tuple[Family, ...] = (
    # -- this node and the database (all nodes) -----------------------------------------
    Family(
        "batchyard_info",
        "gauge",
        "The running version, model and backend.",
        lambda f: [(_labels(**f.info_labels()), 1)],
    ),
    Family(
        "batchyard_ready",
        "gauge",
        "1 once the model is loaded and requests are served; 0 while starting or failed.",
        _one(lambda f: 1 if f.state == "ready" else 0),
    ),
    Family(
        "batchyard_batches",
        "gauge",
        "Batches by status (a count in the database).",
        lambda f: [(_labels(status=st), f.batches.get(st, 0)) for st in BATCH_STATUSES],
    ),
    Family(
        "batchyard_batch_lines",
        "gauge",
        "Batch lines by status: pending and running ones, then processed ones by outcome.",
        lambda f: [(_labels(status=st), f.lines.get(st, 0)) for st in LINE_STATUSES],
    ),
    Family(
        "batchyard_batch_projected_finish_seconds",
        "gauge",
        "When the batch in progress is projected to finish (unix seconds): its model's measured "
        "rate, the lines ahead of it and its share.",
        _each_projection(lambda p: p.finish_at),
    ),
    Family(
        "batchyard_batch_deadline_seconds",
        "gauge",
        "When the batch in progress's completion window ends (its expires_at, unix seconds).",
        _each_projection(lambda p: p.deadline),
    ),
    Family(
        "batchyard_batch_projection_error_seconds",
        "gauge",
        "A recently completed batch's projected minus actual finish (positive: it finished "
        "sooner), for its first projection (at=first) and the one at half its lines (at=half).",
        _projection_errors,
    ),
    Family(
        "batchyard_node_lines_running",
        "gauge",
        "Batch lines running now, by the node that claimed them (a count in the database).",
        _by("node", lambda f: f.running),
    ),
    Family(
        "batchyard_node_in_flight",
        "gauge",
        "Lines this node has handed to its engine and not yet recorded.",
        lambda f: [(_labels(node=f.node), f.in_flight)],
    ),
    # -- this node's engine, all its members together -----------------------------------
    Family(
        "batchyard_engine_requests_total",
        "counter",
        "Requests the engine finished (batch lines and online requests), by outcome.",
        _by("outcome", lambda f: f.stats.requests_total if f.stats is not None else {}),
    ),
    Family(
        "batchyard_tokens_total",
        "counter",
        "Tokens the engine has read (prompt, direction=in) and generated (direction=out).",
        lambda f: [
            (_labels(direction="in"), f.stat(lambda s: s.prompt_tokens_total)),
            (_labels(direction="out"), f.stat(lambda s: s.completion_tokens_total)),
        ],
    ),
    Family(
        "batchyard_queue_depth",
        "gauge",
        "Requests waiting in the engine's queue for a slot.",
        _one(lambda f: f.stat(lambda s: s.queue_depth)),
    ),
    Family(
        "batchyard_active_slots",
        "gauge",
        "Slots decoding a sequence now.",
        _one(lambda f: f.stat(lambda s: s.active_slots)),
    ),
    Family(
        "batchyard_slots",
        "gauge",
        "Slots the engine has (--parallel).",
        _one(lambda f: f.engine.info.n_slots if f.engine is not None else 0),
    ),
    Family(
        "batchyard_tokens_per_second",
        "gauge",
        "Generated tokens per second over the last few seconds.",
        _one(lambda f: f.stats.tokens_per_second if f.stats is not None else 0.0),
    ),
    # -- each engine, labelled by its name (`embedded`, or an --engine NAME) ------------
    Family(
        "batchyard_engine_up",
        "gauge",
        "1 while the engine answers (an upstream's GET /v1/models succeeds), else 0.",
        _each_engine(lambda v: 1 if v.up else 0),
    ),
    Family(
        "batchyard_engine_in_flight",
        "gauge",
        "Requests the engine is working on now (embedded: busy slots; upstream: open requests).",
        _each_engine(lambda v: v.stats.active_slots),
    ),
    Family(
        "batchyard_engine_queue_depth",
        "gauge",
        "Requests waiting for the engine (an upstream's include those waiting out a backoff).",
        _each_engine(lambda v: v.stats.queue_depth),
    ),
    Family(
        "batchyard_engine_slots",
        "gauge",
        "Requests the engine may run at once (--parallel, or an upstream's concurrency=).",
        _each_engine(lambda v: v.info.n_slots),
    ),
    Family(
        "batchyard_engine_errors_total",
        "counter",
        "Requests the engine finished with an error (after an upstream's retries).",
        _each_engine(lambda v: v.errors),
    ),
    Family(
        "batchyard_engine_tokens_per_second",
        "gauge",
        "Generated tokens per second over the last few seconds, per engine.",
        _each_engine(lambda v: v.stats.tokens_per_second),
    ),
    Family(
        "batchyard_engine_completion_tokens_total",
        "counter",
        "Tokens the engine has generated.",
        _each_engine(lambda v: v.stats.completion_tokens_total),
    ),
    Family(
        "batchyard_upstream_window",
        "gauge",
        "Requests an upstream may have open now: its AIMD window, at most its concurrency.",
        _each_upstream(lambda u: u.window),
    ),
    Family(
        "batchyard_upstream_retries_total",
        "counter",
        "Attempts an upstream's requests made again (connection errors, timeouts, 429, 5xx).",
        _each_upstream(lambda u: u.retries_total),
    ),
    Family(
        "batchyard_upstream_throttled_total",
        "counter",
        "Answers of 429 or 503 from an upstream (each halves its window at most once per round trip).",
        _each_upstream(lambda u: u.throttled_total),
    ),
    # -- the embedded models (the pool), labelled by catalog id --------------------------
    Family(
        "batchyard_model_loads_total",
        "counter",
        "Times the model was loaded since start.",
        _each_model(lambda v: v.loads),
    ),
    Family(
        "batchyard_model_loaded",
        "gauge",
        "1 while the model is loaded (serving or idle), else 0 (on disk, loading, failed).",
        _each_model(lambda v: 1 if v.state in ("loaded", "idle") else 0),
    ),
    Family(
        "batchyard_model_load_seconds",
        "gauge",
        "Seconds the model's last load took.",
        _each_model(lambda v: v.load_seconds),
    ),
    Family(
        "batchyard_models_memory_bytes",
        "gauge",
        "Bytes reserved by the models loaded or loading (measured once loaded, else estimated).",
        _memory(0),
    ),
    Family(
        "batchyard_models_memory_budget_bytes",
        "gauge",
        "Bytes the models may take together (--models-memory, else the free memory less a margin).",
        _memory(1),
    ),
    # -- the queue's health (all nodes): lines waiting to be claimed --------------------
    Family(
        "batchyard_engine_pending_lines",
        "gauge",
        "Batch lines waiting to be claimed, by the engine that will run them.",
        _by("engine", lambda f: f.health.pending_by_engine),
    ),
    Family(
        "batchyard_engine_oldest_pending_seconds",
        "gauge",
        "Age of the oldest batch line waiting for the engine (since its batch was created).",
        _by("engine", lambda f: f.health.oldest_by_engine),
    ),
    Family(
        "batchyard_owner_pending_lines",
        "gauge",
        "Batch lines waiting to be claimed, by owner (API key id; empty on an open server).",
        _by("owner", lambda f: f.health.pending_by_owner),
    ),
    Family(
        "batchyard_unserved_model_lines",
        "gauge",
        "Batch lines waiting for a model that no live node serves now, by the model's id: "
        "never run on another model, they wait for a node that holds it, or their window.",
        _by("model", lambda f: f.unserved),
    ),
)


def figures(
    db: Database,
    engine: Engine | None,
    *,
    engine_failure: str | None,
    node: str,
    in_flight: int,
    projections: Projections | None = None,
) -> Figures:
    """Read what one /metrics page reports."""
    batches, lines = count_by_status(db)
    pool = model_pool(engine)
    return Figures(
        node=node,
        engine=engine,
        engine_failure=engine_failure,
        in_flight=in_flight,
        batches=batches,
        lines=lines,
        running=running_by_node(db),
        stats=engine.stats() if engine is not None else None,
        views=members(engine),
        health=queue_health(db, lanes(engine) if engine is not None else []),
        models=pool.views() if pool is not None else [],
        memory=pool.budget() if pool is not None else None,
        unserved=unserved_by_model(db),
        projections=projections.current() if projections is not None else {},
        projection_errors=list(projections.errors) if projections is not None else [],
    )


def unserved_by_model(db: Database) -> dict[str, int]:
    """Lines waiting for a model no live node serves, summed by the model's id."""
    with db.read() as s:
        waiting = unserved_lines(s)
    out: dict[str, int] = {}
    for by_route in waiting.values():
        for route, n in by_route.items():
            out[route] = out.get(route, 0) + n
    return out


def render(
    *,
    db: Database,
    engine: Engine | None,
    requests: RequestMetrics,
    engine_failure: str | None = None,
    node: str = "",
    in_flight: int = 0,
    projections: Projections | None = None,
) -> str:
    """The whole /metrics page: the database's figures (all nodes) and this node's own."""
    f = figures(
        db,
        engine,
        engine_failure=engine_failure,
        node=node,
        in_flight=in_flight,
        projections=projections,
    )
    out = [line for family in FAMILIES for line in family.render(f)]
    out += requests.render()
    return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))
