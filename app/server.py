"""create_app(): the Litestar app, its dependencies, and a lifespan that runs engine and runner."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.middleware import DefineMiddleware
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from app import __version__
from app.api import batches as batches_api
from app.api import files as files_api
from app.api import inference as inference_api
from app.api import metrics as metrics_api
from app.api import uploads as uploads_api
from app.api.errors import EXCEPTION_HANDLERS
from app.api.openapi import EngineBodyPlugin, openapi_config
from app.api.request_ids import BEFORE_SEND as REQUEST_ID_HOOKS
from app.auth.keys import Keys
from app.auth.middleware import AuthMiddleware, request_owner
from app.auth.sessions import Auth, Sessions
from app.batches.service import BatchService
from app.config import Settings
from app.engine.base import Engine
from app.engine.registry import EngineRegistry, load_engines
from app.errors import APIError
from app.files.service import FileService
from app.files.uploads import UploadService
from app.resources import static_dir, templates_dir
from app.runtime.logs import logging_config
from app.services import Services, build_services
from app.web import routers as web_routers

log = logging.getLogger("batchyard")

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def security_notes(settings: Settings, keys: Keys) -> list[tuple[int, str]]:
    """What to say at startup about who can reach the server: (log level, message)."""
    if keys.enabled:
        return [(logging.INFO, f"API keys are on: {len(keys.by_owner)} key(s), one owner each.")]
    if settings.host in LOCAL_HOSTS:
        return [
            (
                logging.INFO,
                f"No API keys are set: the server listens on {settings.host} only, for this "
                "machine. Set --api-key or --api-keys-file before binding to another address.",
            )
        ]
    return [
        (
            logging.WARNING,
            f"No API keys are set and the server listens on {settings.host}: anyone who can "
            "reach this address can read, run and delete every file and batch, and use the "
            "model. Set --api-key or --api-keys-file, or bind to 127.0.0.1.",
        )
    ]


# -- dependencies: what a handler may name among its parameters --------------------------------
#
# Litestar resolves the dependencies of one level of the graph together, and two or more in an
# anyio task group (two tasks a request, for values that need no awaiting: litestar#4563).
# So each service's provider takes `owner` (and does not use it): it resolves after it, and
# every handler's dependencies resolve one after another, no task group.
# That is 0.3-0.5 ms of the 1.5-3 ms a routed request costs the server (bench/README.md);
# tests/integration/test_dependencies.py keeps every route to levels of one.


def _services(state: State) -> Services:
    services: Services = state.services  # set by create_app; State holds Any
    return services


def provide_services(state: State, owner: NamedDependency[str]) -> Services:  # noqa: ARG001 - see above
    return _services(state)


def provide_files(state: State, owner: NamedDependency[str]) -> FileService:  # noqa: ARG001 - see above
    return _services(state).files


def provide_uploads(state: State, owner: NamedDependency[str]) -> UploadService:  # noqa: ARG001 - see above
    return _services(state).uploads


def provide_batches(state: State, owner: NamedDependency[str]) -> BatchService:  # noqa: ARG001 - see above
    return _services(state).batches


def provide_engine(services: NamedDependency[Services]) -> Engine:
    """The loaded engine; a 503 while the model is still loading (or failed to). It takes
    the services, so that a handler naming both resolves them one after the other."""
    engine = services.engine
    if engine is None:
        raise APIError(
            503,
            "The model is still loading; try again in a few seconds.",
            code="model_loading",
            type="server_error",
        )
    return engine


DEPENDENCIES = {
    "owner": Provide(request_owner, sync_to_thread=False),
    "services": Provide(provide_services, sync_to_thread=False),
    "files": Provide(provide_files, sync_to_thread=False),
    "batches": Provide(provide_batches, sync_to_thread=False),
    "uploads": Provide(provide_uploads, sync_to_thread=False),
    "engine": Provide(provide_engine, sync_to_thread=False),
}


def create_app(settings: Settings, *, engine: Engine | None = None) -> Litestar:
    """The app. With `engine` given (tests) it is the embedded engine as is; otherwise the
    model loads in the background after the server starts, and /health says "starting" until
    then. Either way a registry routes each request by `model` to it or to an upstream."""

    def load(svc: Services) -> None:
        registry, svc.engine_failure = load_engines(settings, engine)
        if registry is not None:
            svc.attach_engine(registry)

    # Read once: the key file and the session secret are not read again per request.
    auth = Auth(keys=Keys(settings), sessions=Sessions(settings.data_path))

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        for level, note in security_notes(settings, auth.keys):
            log.log(level, note)
        svc = build_services(settings)
        app.state.services = svc
        svc.webhooks.start()
        if engine is not None and not settings.engine:
            svc.attach_engine(EngineRegistry(engine, [], owns_embedded=False))
        else:
            threading.Thread(target=load, args=(svc,), name="batchyard-load", daemon=True).start()
        try:
            yield
        finally:
            svc.runner.stop()
            svc.webhooks.stop()
            if svc.engine is not None:
                svc.engine.close()  # the registry closes the upstreams, and what it loaded
            svc.db.close()

    route_handlers: list[Any] = [
        *files_api.HANDLERS,
        *uploads_api.HANDLERS,
        *batches_api.HANDLERS,
        *inference_api.HANDLERS,
        *metrics_api.HANDLERS,
        *web_routers.ROUTERS,
        create_static_files_router(path="/static", directories=[static_dir()]),
    ]
    return Litestar(
        route_handlers=route_handlers,
        dependencies=DEPENDENCIES,
        lifespan=[lifespan],
        # Metrics outermost, so refused (401) requests are timed and counted too.
        middleware=[
            *metrics_api.MIDDLEWARE,
            DefineMiddleware(AuthMiddleware, keys=auth.keys, sessions=auth.sessions),
        ],
        before_send=[*REQUEST_ID_HOOKS, *metrics_api.BEFORE_SEND],
        logging_config=logging_config(settings),
        exception_handlers=EXCEPTION_HANDLERS,
        template_config=TemplateConfig(directory=templates_dir(), engine=JinjaTemplateEngine),
        openapi_config=openapi_config("batchyard", __version__),
        plugins=[EngineBodyPlugin()],
        state=State({"auth": auth}),
        debug=False,
    )
