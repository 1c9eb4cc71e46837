"""The app's services in one container: what the API, the dashboard and `batchyard run` share.

`build_services` makes the data dir, the database, storage, the files and batches services
and the runner; the engine may come later (it loads in the background while the server
already answers), and `attach_engine` hands it to the runner and starts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.batches.nodes import node_models
from app.batches.runner import Runner
from app.batches.service import BatchService
from app.config import Settings
from app.db import Database
from app.engine.base import Engine
from app.files.backend import open_storage
from app.files.service import FileService
from app.files.storage import UNFINISHED_MAX_AGE, Storage
from app.files.uploads import UploadService
from app.images import ImageResolver
from app.sheets.service import SheetService
from app.webhooks.service import WebhookService


@dataclass
class Services:
    settings: Settings
    db: Database
    storage: Storage
    files: FileService
    batches: BatchService
    runner: Runner
    uploads: UploadService
    webhooks: WebhookService
    sheets: SheetService
    engine: Engine | None = None
    #: Why the model could not be loaded ("Type: message"), for /health and the dashboard.
    engine_failure: str | None = None

    @property
    def images(self) -> ImageResolver:
        """The image resolver the runner's lines and online requests share (one cache, one
        set of fetches): images in the form of the engine their model routes to."""
        return self.runner.images

    def attach_engine(self, engine: Engine, *, start: bool = True) -> None:
        """Use `engine` from now on; the runner starts unless a test steps it by hand."""
        self.engine = engine
        self.runner.engine = engine
        # The node's model names for the other nodes, and what validation knows of models.
        self.runner.nodes, self.runner.models = node_models(
            self.settings, self.db, self.runner.worker_id, engine
        )
        if start:
            self.runner.start()


def build_services(
    settings: Settings, engine: Engine | None = None, **runner_options: Any
) -> Services:
    """The data dir, database, storage and services. `runner_options` go to `Runner`
    (`sweep_interval`, `finalize_retry_delays`); an engine given here is attached but the
    runner is not started."""
    settings.data_path.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    db.migrate()
    storage = open_storage(settings)
    files = FileService(settings, db, storage)
    runner = Runner(settings, db, storage, files, None, **runner_options)
    uploads = UploadService(settings, db, storage, files)
    runner.sweeps.append(uploads.sweep_expired)
    runner.sweeps.append(lambda: storage.sweep_unfinished(UNFINISHED_MAX_AGE))
    webhooks = WebhookService(settings, db)
    runner.end_hooks.append(webhooks.enqueue)
    batches = BatchService(settings, db, runner)
    svc = Services(
        settings=settings,
        db=db,
        storage=storage,
        files=files,
        batches=batches,
        runner=runner,
        uploads=uploads,
        webhooks=webhooks,
        sheets=SheetService(settings, db, storage, files, batches),
    )
    if engine is not None:
        svc.attach_engine(engine, start=False)
    return svc
