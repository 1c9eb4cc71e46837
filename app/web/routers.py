"""The dashboard's two routers: the pages, and the htmx fragments.

Neither is part of the OpenAI API, so both leave the OpenAPI schema (once here, not on each
handler). The fragments' router also holds the one answer to a refusal inside a fragment:
an `APIError` raised by any fragment handler renders `partials/inline_error.html`, a
sentence where the fragment would go, with status 200 (htmx swaps only 2xx answers; a JSON
error would leave the old content in place and say nothing). The pages keep the app's JSON
errors: a page that is not there is a 404, and so is a file download for another owner.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Router
from litestar.response import Template

from app.errors import APIError
from app.web import events, explorer, models, pages, partials, sheets
from app.web.login import AUTH_ROUTES


def inline_error(request: Request[Any, Any, Any], exc: APIError) -> Template:  # noqa: ARG001 - Litestar's
    """A fragment's refusal, as a sentence in place of the fragment."""
    return Template(
        template_name="partials/inline_error.html", context={"error": exc}, status_code=200
    )


FRAGMENTS = Router(
    path="/",
    route_handlers=[*partials.HANDLERS, *explorer.FRAGMENTS, *models.FRAGMENTS, *sheets.FRAGMENTS],
    include_in_schema=False,
    exception_handlers={APIError: inline_error},
)

PAGES = Router(
    path="/",
    route_handlers=[
        *pages.HANDLERS,
        *models.PAGES,
        *events.HANDLERS,
        *explorer.DOWNLOADS,
        *sheets.PAGES,
        *AUTH_ROUTES,
    ],
    include_in_schema=False,
)

ROUTERS = [PAGES, FRAGMENTS]
