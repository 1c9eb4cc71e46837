"""Log lines: one format and one level (`--log-level`) for the server's own loggers and Litestar's.

Every HTTP request logs `method=... path=... status=... ms=...` (app/api/metrics.py) and
every batch transition `batch <id> <status>: ...` (the runner), each under its logger name.
"""

from __future__ import annotations

from litestar.logging.config import LoggingConfig

from app.config import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def logging_config(settings: Settings) -> LoggingConfig:
    """Litestar's logging set-up at the level the settings name (it otherwise forces INFO)."""
    level = settings.log_level.upper()
    return LoggingConfig(
        formatters={"standard": {"format": LOG_FORMAT}},
        root={"handlers": ["queue_listener"], "level": level},
        loggers={
            "litestar": {"level": level, "handlers": ["queue_listener"], "propagate": False},
            # httpx logs every upstream request at INFO; the upstream engine logs what matters.
            "httpx": {"level": "WARNING"},
        },
    )
