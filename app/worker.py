"""`batchyard worker`: a node without the HTTP API, for machines that only run lines.

It is the runner and the engine of `batchyard serve`, on the same database (PostgreSQL,
shared with the serving nodes) and the same files location; it stops on SIGTERM or
Ctrl-C, cancelling what its engine still runs; the leases of those lines then lapse and
another node takes them.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from app import __version__
from app.config import Settings
from app.runtime.logs import LOG_FORMAT

log = logging.getLogger("batchyard")


def run_worker(settings: Settings) -> int:
    from app.db import DatabaseError
    from app.engine.registry import load_engines
    from app.runtime.heap import freeze_startup
    from app.services import build_services

    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    try:
        services = build_services(settings)
    except DatabaseError as exc:
        print(f"batchyard: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    node = services.runner.worker_id
    print(
        f"batchyard {__version__}: worker {node} loading the model; "
        f"database {services.db.safe_url}, data {settings.data_path}",
        flush=True,
    )
    # The same engines as `serve`: a line for an upstream's model goes to that upstream.
    engine, failure = load_engines(settings)
    if engine is None:
        print(f"batchyard: the model could not be loaded: {failure}", file=sys.stderr, flush=True)
        services.db.close()
        return 1
    freeze_startup()  # the services and engines, out of the collector's walks (app/runtime/heap.py)
    # Webhooks of batches that end here go out from here too (any node sends what is due).
    services.webhooks.start()
    try:
        services.attach_engine(engine)
        print(
            f"batchyard worker {node} ready: {engine.info.id} on {engine.info.backend}, "
            f"{engine.info.n_slots} slots",
            flush=True,
        )
        stop.wait()
    finally:
        services.runner.stop()
        services.webhooks.stop()
        engine.close()
        services.db.close()
    log.info("worker %s stopped", node)
    return 0
