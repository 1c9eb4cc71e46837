"""Shared fixtures: one live `batchyard serve` process on the real default model per session.

Helpers live in modules of their own (tests/live.py, factories.py, http_helpers.py, fakes.py);
this file holds fixtures only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.seaweed import Seaweed, seaweed_server
from tests import pg
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.reasoning import reasoning_model_paths


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("live-data")
    server = start_server(data, OUTPUT / "live-server.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A database of its own for this test session on BATCHYARD_TEST_DATABASE_URL's server."""
    if reason := pg.unreachable():
        pytest.skip(reason)
    with pg.fresh_database() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_database: str) -> Iterator[str]:
    """A SQLAlchemy URL on an empty schema of the session's PostgreSQL database."""
    with pg.fresh_schema(postgres_database) as url:
        yield url


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    """A real SeaweedFS answering S3 on a free port, with an empty bucket, for the session."""
    data = tmp_path_factory.mktemp("seaweed")
    with seaweed_server(data, OUTPUT / "seaweed.log") as server:
        if isinstance(server, str):
            pytest.skip(server)
        yield server


@pytest.fixture(scope="session")
def reasoning_models() -> dict[str, Path]:
    """The thinking models by format (`think`, `opened`, `channels`): one folder, written
    once per machine (tests/reasoning.py); a `--models-dir` serves them under those ids."""
    return reasoning_model_paths()
