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
from typing import TYPE_CHECKING, Any

from sqlalchemy import func
from sqlmodel import col, select

from app import __version__
from app.batches.health import QueueHealth, queue_health
from app.db import Database
from app.engine.registry import EngineView, lanes, members
from app.models import Batch, BatchStatus, Request, RequestStatus

if TYPE_CHECKING:
    from app.engine.base import Engine

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


def render(
    *,
    db: Database,
    engine: Engine | None,
    requests: RequestMetrics,
    engine_failure: str | None = None,
    node: str = "",
    in_flight: int = 0,
) -> str:
    """The whole /metrics page: the database's figures (all nodes) and this node's own."""
    batches, lines = count_by_status(db)
    running = running_by_node(db)
    out: list[str] = []

    def family(name: str, kind: str, text: str, samples: Iterable[tuple[str, Any]]) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

    info_labels = {"version": __version__, "node": node}
    if engine is not None:
        info_labels |= {"model": engine.info.id, "backend": engine.info.backend}
    family(
        "batchyard_info",
        "gauge",
        "The running version, model and backend.",
        [(_labels(**info_labels), 1)],
    )
    state = "ready" if engine is not None else ("failed" if engine_failure else "starting")
    family(
        "batchyard_ready",
        "gauge",
        "1 once the model is loaded and requests are served; 0 while starting or failed.",
        [("", 1 if state == "ready" else 0)],
    )
    family(
        "batchyard_batches",
        "gauge",
        "Batches by status (a count in the database).",
        [(_labels(status=st), batches.get(st, 0)) for st in BATCH_STATUSES],
    )
    family(
        "batchyard_batch_lines",
        "gauge",
        "Batch lines by status: pending and running ones, then processed ones by outcome.",
        [(_labels(status=st), lines.get(st, 0)) for st in LINE_STATUSES],
    )

    family(
        "batchyard_node_lines_running",
        "gauge",
        "Batch lines running now, by the node that claimed them (a count in the database).",
        [(_labels(node=n), count) for n, count in sorted(running.items())],
    )
    family(
        "batchyard_node_in_flight",
        "gauge",
        "Lines this node has handed to its engine and not yet recorded.",
        [(_labels(node=node), in_flight)],
    )

    stats = engine.stats() if engine is not None else None
    outcomes = stats.requests_total if stats is not None else {}
    family(
        "batchyard_engine_requests_total",
        "counter",
        "Requests the engine finished (batch lines and online requests), by outcome.",
        [(_labels(outcome=k), v) for k, v in sorted(outcomes.items())],
    )
    family(
        "batchyard_tokens_total",
        "counter",
        "Tokens the engine has read (prompt, direction=in) and generated (direction=out).",
        [
            (_labels(direction="in"), stats.prompt_tokens_total if stats else 0),
            (_labels(direction="out"), stats.completion_tokens_total if stats else 0),
        ],
    )
    family(
        "batchyard_queue_depth",
        "gauge",
        "Requests waiting in the engine's queue for a slot.",
        [("", stats.queue_depth if stats else 0)],
    )
    family(
        "batchyard_active_slots",
        "gauge",
        "Slots decoding a sequence now.",
        [("", stats.active_slots if stats else 0)],
    )
    family(
        "batchyard_slots",
        "gauge",
        "Slots the engine has (--parallel).",
        [("", engine.info.n_slots if engine is not None else 0)],
    )
    family(
        "batchyard_tokens_per_second",
        "gauge",
        "Generated tokens per second over the last few seconds.",
        [("", stats.tokens_per_second if stats else 0.0)],
    )
    per_engine(family, members(engine))
    waiting(family, queue_health(db, lanes(engine) if engine is not None else []))
    out += requests.render()
    return "\n".join(out) + "\n"


def waiting(
    family: Callable[[str, str, str, Iterable[tuple[str, Any]]], None], health: QueueHealth
) -> None:
    """The queue's health (all nodes): lines waiting to be claimed, by engine and by owner."""
    family(
        "batchyard_engine_pending_lines",
        "gauge",
        "Batch lines waiting to be claimed, by the engine that will run them.",
        [(_labels(engine=e), n) for e, n in sorted(health.pending_by_engine.items())],
    )
    family(
        "batchyard_engine_oldest_pending_seconds",
        "gauge",
        "Age of the oldest batch line waiting for the engine (since its batch was created).",
        [(_labels(engine=e), age) for e, age in sorted(health.oldest_by_engine.items())],
    )
    family(
        "batchyard_owner_pending_lines",
        "gauge",
        "Batch lines waiting to be claimed, by owner (API key id; empty on an open server).",
        [(_labels(owner=o), n) for o, n in sorted(health.pending_by_owner.items())],
    )


def per_engine(
    family: Callable[[str, str, str, Iterable[tuple[str, Any]]], None], views: list[EngineView]
) -> None:
    """Each engine's own figures, labelled by its name (`embedded`, or an --engine NAME)."""

    def each(value: Callable[[EngineView], Any]) -> list[tuple[str, Any]]:
        return [(_labels(engine=v.name), value(v)) for v in views]

    family(
        "batchyard_engine_up",
        "gauge",
        "1 while the engine answers (an upstream's GET /v1/models succeeds), else 0.",
        each(lambda v: 1 if v.up else 0),
    )
    family(
        "batchyard_engine_in_flight",
        "gauge",
        "Requests the engine is working on now (embedded: busy slots; upstream: open requests).",
        each(lambda v: v.stats.active_slots),
    )
    family(
        "batchyard_engine_queue_depth",
        "gauge",
        "Requests waiting for the engine (an upstream's include those waiting out a backoff).",
        each(lambda v: v.stats.queue_depth),
    )
    family(
        "batchyard_engine_slots",
        "gauge",
        "Requests the engine may run at once (--parallel, or an upstream's concurrency=).",
        each(lambda v: v.info.n_slots),
    )
    family(
        "batchyard_engine_errors_total",
        "counter",
        "Requests the engine finished with an error (after an upstream's retries).",
        each(lambda v: v.errors),
    )
    family(
        "batchyard_engine_tokens_per_second",
        "gauge",
        "Generated tokens per second over the last few seconds, per engine.",
        each(lambda v: v.stats.tokens_per_second),
    )
    family(
        "batchyard_engine_completion_tokens_total",
        "counter",
        "Tokens the engine has generated.",
        each(lambda v: v.stats.completion_tokens_total),
    )
    upstreams = [v for v in views if v.upstream is not None]
    family(
        "batchyard_upstream_window",
        "gauge",
        "Requests an upstream may have open now: its AIMD window, at most its concurrency.",
        [(_labels(engine=v.name), v.upstream.window) for v in upstreams if v.upstream],
    )
    family(
        "batchyard_upstream_retries_total",
        "counter",
        "Attempts an upstream's requests made again (connection errors, timeouts, 429, 5xx).",
        [(_labels(engine=v.name), v.upstream.retries_total) for v in upstreams if v.upstream],
    )
    family(
        "batchyard_upstream_throttled_total",
        "counter",
        "Answers of 429 or 503 from an upstream (each halves its window at most once per round trip).",
        [(_labels(engine=v.name), v.upstream.throttled_total) for v in upstreams if v.upstream],
    )


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
