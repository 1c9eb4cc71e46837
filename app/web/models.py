"""The dashboard's Models page: every model the catalog lists, its state in the engine pool,
and the buttons that load and unload it.

It reads the pool's `views()` and `budget()` (app/engine/pool) and calls its `load(id)` and
`unload(id)`, the same calls the pool's own planner answers to; nothing here loads a model.
The table is a fragment, fetched again every few seconds and after each button, so a
model's state moves from "on disk" through "loading" to "loaded" without a reload. A
button's answer is a sentence in its own region, so the next refresh of the table leaves
it in place: an unload refused because lines are in flight says so until the next button.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from litestar import get, post
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body
from litestar.response import Template

from app.batches.nodes import unserved_lines
from app.catalog import DEFAULT_ROUTE
from app.engine.base import EngineError
from app.engine.node import EMBEDDED, ModelView, members, model_pool, reasons
from app.services import Services
from app.tables import Batch
from app.web import views

#: The tone of each state's badge (macros.html).
STATE_TONE = {
    "loaded": "ok",
    "idle": "ok",
    "loading": "info",
    "on disk": "muted",
    "failed": "bad",
}
#: The htmx event a button's answer raises: the table is fetched again at once.
CHANGED = "models-changed"


def model_row(view: ModelView, now: float | None = None) -> dict[str, Any]:
    """One ModelView as the table shows it."""
    entry = view.entry
    estimate = entry.estimate.total if entry.estimate is not None else None
    measured = view.measured_bytes
    return {
        "id": entry.id,
        "default": entry.is_default,
        # Its other names, but for the spellings every id has (`:latest`, the file's name).
        "aliases": sorted(
            n
            for n in entry.names
            if n not in (entry.id, f"{entry.id}.gguf") and not n.endswith(":latest")
        ),
        "source": entry.source,
        "path": str(entry.path),
        "architecture": entry.architecture,
        "size": views.size(entry.size_bytes),
        "quantization": entry.quantization,
        "ctx_size": entry.profile.ctx_size,
        "context_length": entry.context_length,
        "estimate": views.size(estimate) if estimate is not None else None,
        # A model with a multimodal projector takes images; its share of the estimate.
        "images": entry.projector is not None,
        "projector": entry.projector.name if entry.projector else None,
        "projector_path": str(entry.projector) if entry.projector else None,
        "projector_estimate": views.size(entry.estimate.projector)
        if entry.projector is not None and entry.estimate is not None
        else None,
        # Its chat template writes a thought apart from the answer (a thinking model).
        "reasoning": reasons(entry),
        "measured": views.size(measured) if measured is not None else None,
        # How far the estimate was off once the model was loaded (issue 32: "report it").
        "off_pct": round(100 * (measured - estimate) / estimate)
        if measured is not None and estimate
        else None,
        "state": view.state,
        "tone": STATE_TONE.get(view.state, "muted"),
        "in_flight": view.in_flight,
        "waiting": view.waiting,
        "loads": view.loads,
        "load_seconds": view.load_seconds,
        "last_used": views.when(view.last_used, now),
        "error": entry.error or view.error,
        "can_load": view.state in ("on disk", "failed") and not entry.error,
        "can_unload": view.state in ("loaded", "idle"),
    }


def models_context(services: Services, now: float | None = None) -> dict[str, Any]:
    """What the Models page and its table show; `pool` None when this node has none."""
    pool = model_pool(services.engine)
    if pool is None:
        return {"pool": False, "rows": [], "failure": services.engine_failure}
    reserved, budget = pool.budget()
    rows = [model_row(v, now) for v in pool.views()]
    return {
        "pool": True,
        "rows": rows,
        "reserved": views.size(reserved),
        "budget": views.size(budget),
        "reserved_pct": min(100.0, 100 * reserved / budget) if budget else 0.0,
        "reserved_bytes": reserved,
        "budget_bytes": budget,
        "loaded": sum(1 for r in rows if r["state"] in ("loaded", "idle")),
    }


def model_choices(services: Services) -> list[str]:
    """The ids the New batch card's "Run with" offers: every model of the pool's catalog
    that can load, the default first; none without a pool."""
    pool = model_pool(services.engine)
    if pool is None:
        return []
    return [v.entry.id for v in pool.views() if not v.entry.error]


def batch_model(services: Services, batch: Batch) -> dict[str, Any] | None:
    """The model that runs the batch's lines, by its route (a batch page's "Model"): the
    pool's model with its state now, its loads since start and those it took while the
    batch ran (this node's, since it started), and `unserved`, the lines that wait because
    no live node serves that model now. None before the batch is routed, or when an
    upstream engine or only another node serves it and every node that does is up."""
    route = batch.route
    if route is None:
        return None
    with services.db.read() as s:
        unserved = unserved_lines(s, batch_id=batch.id).get(batch.id, {}).get(route, 0)
    pool = model_pool(services.engine)
    upstream = any(route in e.models for e in members(services.engine) if e.kind != EMBEDDED)
    found = pool.views() if pool is not None and not upstream else []
    if route == DEFAULT_ROUTE:
        view = next((v for v in found if v.entry.is_default), None)
    else:
        view = next((v for v in found if v.entry.id == route), None)
    if view is None:
        return {"id": route, "named": True, "unserved": unserved} if unserved else None
    return {
        "id": view.entry.id,
        "named": route != DEFAULT_ROUTE,  # False: no model has that name: the default runs it
        "state": view.state,
        "tone": STATE_TONE.get(view.state, "muted"),
        "loads": view.loads,
        "while_running": _loads_while_running(view.loaded_at, batch),
        "unserved": unserved,
    }


def _loads_while_running(loaded_at: tuple[float, ...], batch: Batch) -> int:
    """The model's loads between the batch's start and its end (or now)."""
    start = batch.in_progress_at
    if start is None:
        return 0
    ends = (batch.completed_at, batch.failed_at, batch.cancelled_at, batch.expired_at)
    end = next((t for t in ends if t is not None), None)
    # The batch's times are whole seconds: a load that finished in its last second counts.
    return sum(1 for t in loaded_at if t >= start and (end is None or t < end + 1))


@get("/models", name="web:models", sync_to_thread=True)
def models_page(services: NamedDependency[Services]) -> Template:
    """Every model, its state, its demand and its load and unload buttons."""
    return Template(template_name="models.html", context=models_context(services, time.time()))


@get("/web/models", name="web:models_table", sync_to_thread=True)
def models_table(services: NamedDependency[Services]) -> Template:
    return Template(
        template_name="partials/models_table.html", context=models_context(services, time.time())
    )


def _act(services: Services, model: str, unload: bool) -> Template:
    """Ask the pool to load or unload `model`; the answer is the sentence that says what
    happens next, or why not (a model with lines in flight is not unloaded)."""
    pool = model_pool(services.engine)
    error: str | None = None
    done = ""
    if pool is None:
        error = (
            "This node has no embedded models to load or unload: it runs with "
            "--no-embedded, or its engine is still starting."
        )
    elif not model:
        error = "Choose a model."
    else:
        try:
            if unload:
                pool.unload(model)
                done = f"Unloading {model}: its memory is free once its state says on disk."
            else:
                pool.load(model)
                done = f"Loading {model}: it is ready once its state says idle or loaded."
        except EngineError as exc:
            error = exc.message
    return Template(
        template_name="partials/models_message.html",
        context={"message": done, "error": error},
        headers={"HX-Trigger": CHANGED},
    )


@post("/web/models/load", name="web:models_load", sync_to_thread=True, status_code=200)
def load_model(
    data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
    services: NamedDependency[Services],
) -> Template:
    return _act(services, data.get("model", "").strip(), unload=False)


@post("/web/models/unload", name="web:models_unload", sync_to_thread=True, status_code=200)
def unload_model(
    data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
    services: NamedDependency[Services],
) -> Template:
    return _act(services, data.get("model", "").strip(), unload=True)


PAGES = [models_page]
FRAGMENTS = [models_table, load_model, unload_model]
