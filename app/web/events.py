"""The dashboard's live streams (server-sent events): the batch list, one batch, the engine.

Each stream is one `poll_until`: every tick it renders its partials, sends the ones whose
HTML changed since last sent, and ends with a `done` event once its batches finish.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from app.batches.service import BatchService
from app.services import Services
from app.tables import BatchStatus
from app.web import views
from app.web.explorer import chart_context
from app.web.models import batch_model
from app.web.pages import PAGE_SIZE, engines_context, summary_context

#: Seconds between two looks at the database in a live stream.
TICK = 1.0

#: Seconds between two drawings of a running batch's throughput chart when no line finished.
CHART_TICK = 5.0

#: One look: the HTML of each event by name, and whether the stream is over.
Frame = tuple[dict[str, str], bool]


async def poll_until(
    look: Callable[[], Awaitable[Frame]], tick: float = TICK
) -> AsyncIterator[ServerSentEventMessage]:
    """Send each event whose HTML changed since it was last sent, every `tick` seconds,
    until `look` says the stream is over; then a `done` event (htmx's sse-close)."""
    sent: dict[str, str] = {}
    while True:
        frame, over = await look()
        for event, html in frame.items():
            if sent.get(event) != html:
                sent[event] = html
                yield ServerSentEventMessage(event=event, data=html)
        if over:
            break
        await anyio.sleep(tick)
    yield ServerSentEventMessage(event="done", data="")


def render(request: Request[Any, Any, Any], name: str, **context: Any) -> str:
    """A partial as a string, for an event's data."""
    templates = request.app.template_engine
    if templates is None:
        raise RuntimeError("create_app configures the dashboard's templates")
    return str(templates.get_template(name).render(request=request, **context))


@get("/web/events/batches", name="web:list_events")
async def list_events(
    request: Request[Any, Any, Any],
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    ids: FromQuery[str] = "",
) -> ServerSentEvent:
    """Rows of the running batches in `ids`, sent when they change; ends when all finish."""
    wanted = [i for i in ids.split(",") if i][:PAGE_SIZE]
    trackers = {i: views.RateTracker() for i in wanted}
    active = set(wanted)

    async def look() -> Frame:
        rows = await anyio.to_thread.run_sync(batches.get_many, owner, sorted(active))
        now = time.time()
        frame = {}
        for batch_id in sorted(active):
            batch = rows.get(batch_id)
            if batch is None:
                active.discard(batch_id)
                continue
            trackers[batch_id].add(batch, now)
            projection = batches.runner.projections.get(batch_id)
            row = views.batch_row(batch, trackers[batch_id], now, projection)
            frame[f"row-{batch_id}"] = render(request, "partials/batch_row.html", r=row)
            if batch.status in BatchStatus.FINISHED:
                active.discard(batch_id)
        return frame, not active

    return ServerSentEvent(poll_until(look))


@get("/web/events/batch/{batch_id:str}", name="web:batch_events")
async def batch_events(
    request: Request[Any, Any, Any],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    batch_id: FromPath[str],
) -> ServerSentEvent:
    """The batch page's summary, its throughput chart, and a `lines` event that tells the
    results explorer to fetch its page again when lines finish; until the batch is done."""
    tracker = views.RateTracker()
    seen_done = -1
    chart_at = 0.0

    async def look() -> Frame:
        nonlocal seen_done, chart_at
        batch = await anyio.to_thread.run_sync(services.batches.get, batch_id, owner)
        now = time.time()
        engine = services.engine
        tracker.add(batch, now, engine.stats().tokens_per_second if engine else None)
        model = await anyio.to_thread.run_sync(batch_model, services, batch)
        projection = services.runner.projections.get(batch_id)
        context = summary_context(batch, tracker, now, model, projection)
        over = batch.status in BatchStatus.FINISHED
        frame = {"summary": render(request, "partials/batch_summary.html", **context)}
        done = batch.completed + batch.failed
        # The chart reads every finished line's second: at most every CHART_TICK seconds.
        if done != seen_done or over or now - chart_at >= CHART_TICK:
            chart_at = now
            chart = await anyio.to_thread.run_sync(chart_context, services.batches, batch, now)
            frame["chart"] = render(request, "partials/throughput_chart.html", **chart)
        if done != seen_done or over:
            seen_done = done
            frame["lines"] = f"{done} {batch.status}"
        return frame, over

    return ServerSentEvent(poll_until(look))


@get("/web/events/engine", name="web:engine_events")
async def engine_events(
    request: Request[Any, Any, Any],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
) -> ServerSentEvent:
    """Every engine's live figures, and which node runs what, once a second, for as long as
    the page is open."""

    async def look() -> Frame:
        if services.engine is None:  # still loading: nothing to show yet
            return {}, False
        context = await anyio.to_thread.run_sync(engines_context, services, owner)
        html = render(request, "partials/engines_live.html", **context)
        return {"stats": html}, False

    return ServerSentEvent(poll_until(look))


HANDLERS = [list_events, batch_events, engine_events]
