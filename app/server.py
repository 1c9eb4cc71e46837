"""create_app(): the Litestar app, its services, and a lifespan that runs engine and runner."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from app import __version__
from app.api import batches as batches_api
from app.api import files as files_api
from app.api import inference as inference_api
from app.api import metrics as metrics_api
from app.api.auth import auth_middleware, security_notes
from app.api.common import Services
from app.api.errors import EXCEPTION_HANDLERS
from app.batches.runner import Runner
from app.batches.service import BatchService
from app.config import Settings
from app.db import Database
from app.engine.base import Engine
from app.files import FileService
from app.logs import logging_config
from app.resources import static_dir, templates_dir
from app.storage import Storage
from app.web.auth import AUTH_ROUTES
from app.web.openapi import openapi_config
from app.web.routes import web_route_handlers

log = logging.getLogger("batchyard")


def build_services(settings: Settings, engine: Engine | None = None) -> Services:
    """The data dir, database, storage and services; the engine may come later."""
    data = settings.data_path
    data.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    db.create_all()
    storage = Storage(data)
    files = FileService(settings, db, storage)
    runner = Runner(settings, db, storage, files, engine)  # type: ignore[arg-type]
    batches = BatchService(settings, db, runner)
    return Services(
        settings=settings,
        db=db,
        storage=storage,
        files=files,
        batches=batches,
        runner=runner,
        engine=engine,
    )  # type: ignore[arg-type]


def create_app(settings: Settings, *, engine: Engine | None = None) -> Litestar:
    """The app. With `engine` given (tests) it is used as is; otherwise the model loads in
    the background after the server starts, and /health says "starting" until then."""

    def attach(svc: Services, eng: Engine) -> None:
        svc.engine = eng
        svc.runner.engine = eng
        svc.runner.start()

    def load(svc: Services, app: Litestar) -> None:
        from app.engine.llama import load_engine

        try:
            eng = load_engine(settings)
        except Exception as exc:  # a bad model path: say so on /health, keep the API up
            log.exception("the model could not be loaded")
            app.state.engine_failure = f"{type(exc).__name__}: {exc}"
            return
        attach(svc, eng)
        log.info("ready: %s on %s, %d slots", eng.info.id, eng.info.backend, eng.info.n_slots)

    auth = auth_middleware(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        for level, note in security_notes(settings, auth.keys):  # type: ignore[attr-defined]
            log.log(level, note)
        svc = build_services(settings, None)
        app.state.services = svc
        app.state.engine_failure = None
        if engine is not None:
            attach(svc, engine)
        else:
            threading.Thread(
                target=load, args=(svc, app), name="batchyard-load", daemon=True
            ).start()
        try:
            yield
        finally:
            svc.runner.stop()
            if svc.engine is not None and engine is None:
                svc.engine.close()
            svc.db.close()

    return Litestar(
        route_handlers=[
            *files_api.ROUTES,
            *batches_api.ROUTES,
            *inference_api.ROUTES,
            *metrics_api.ROUTES,
            *web_route_handlers(),
            *AUTH_ROUTES,
            create_static_files_router(path="/static", directories=[static_dir()]),
        ],
        lifespan=[lifespan],
        # Metrics outermost, so refused (401) requests are timed and counted too.
        middleware=[*metrics_api.MIDDLEWARE, auth],
        before_send=metrics_api.BEFORE_SEND,
        logging_config=logging_config(settings),
        exception_handlers=EXCEPTION_HANDLERS,
        template_config=TemplateConfig(directory=templates_dir(), engine=JinjaTemplateEngine),
        openapi_config=openapi_config("batchyard", __version__),
        state=None,
        debug=False,
    )
