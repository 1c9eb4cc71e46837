"""`batchyard serve` and `batchyard worker`: a node with the HTTP API and the dashboard, or
one that only runs lines from a shared queue."""

from __future__ import annotations

import logging
import sys
import threading
import webbrowser

from app import __version__
from app.config import Settings


def serve(settings: Settings) -> int:
    from app.auth.keys import keys_problem
    from app.files.backend import files_problem
    from app.files.storage import data_dir_problem

    if problem := (
        data_dir_problem(settings.data_path)
        or files_problem(settings)
        or keys_problem(settings)
        or database_problem(settings)
    ):
        print(f"batchyard: {problem}", file=sys.stderr)
        return 1
    import uvicorn

    from app.runtime.heap import freeze_startup
    from app.runtime.logs import LOG_FORMAT
    from app.server import create_app

    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    app = create_app(settings)
    freeze_startup()  # the app and its modules, out of the collector's walks (app/runtime/heap.py)
    url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}/"
    print(
        f"batchyard {__version__}: dashboard {url}  API {url}v1  data {settings.data_path}",
        flush=True,
    )
    if not settings.no_browser:
        threading.Timer(1.0, lambda: webbrowser.open(url)).start()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
    return 0


def database_problem(settings: Settings) -> str | None:
    """Why the database cannot be used, or None. A SQLite file is taken for this process
    here, before anything starts (another process on it is refused with its pid)."""
    from app.db import DatabaseError, hold_sqlite_file, sqlite_file

    db_file = sqlite_file(settings.db_url)
    if db_file is None:
        return None
    try:
        hold_sqlite_file(db_file)  # held until the process ends
    except DatabaseError as exc:
        return str(exc)
    return None


def worker(settings: Settings) -> int:
    from app.files.backend import files_problem
    from app.files.storage import data_dir_problem
    from app.worker import run_worker

    if problem := (
        data_dir_problem(settings.data_path)
        or files_problem(settings)
        or database_problem(settings)
    ):
        print(f"batchyard: {problem}", file=sys.stderr)
        return 1
    return run_worker(settings)
