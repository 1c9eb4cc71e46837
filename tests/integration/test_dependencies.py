"""Every route's dependencies resolve one after another, never in a task group.

Litestar resolves each level of a handler's dependency graph together, and a level of two or
more in an anyio task group: two tasks on every request, for values that need no awaiting
(litestar#4563). The service providers take `owner` so that they resolve after it
(app/server.py). A handler that names two of them at once would bring the task group back;
this test names it. That each handler still gets its caller's `owner` is
tests/integration/test_auth.py's to check.
"""

from __future__ import annotations

import warnings

from litestar.routes import HTTPRoute

from app.config import Settings
from app.server import create_app
from tests.fakes import FakeEngine


def test_no_route_resolves_two_dependencies_at_once(settings: Settings) -> None:
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        app = create_app(settings, engine=FakeEngine())
    # The providers name `owner` as NamedDependency: an inferred one is deprecated (Litestar 3).
    assert [str(w.message) for w in warned] == []
    seen, together = 0, []
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for method, (handler, kwargs_model) in route.route_handler_map.items():
            batches = kwargs_model.dependency_batches
            seen += sum(len(b) for b in batches)
            for batch in batches:
                if len(batch) > 1:
                    names = sorted(d.key for d in batch)
                    together.append(f"{method} {route.path} ({handler.handler_name}): {names}")
    assert seen > 50, "the routes' dependencies were not found where Litestar keeps them"
    assert together == []
