"""Dashboard routes (a first page; the full dashboard builds on the same services)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.response import Template


@get("/", include_in_schema=False, sync_to_thread=True)
def home(request: Request) -> Template:
    svc = request.app.state.services
    rows, _ = svc.batches.list("", limit=20)
    return Template(template_name="index.html", context={"batches": rows, "engine": svc.engine})


def web_route_handlers() -> list[Any]:
    return [home]
