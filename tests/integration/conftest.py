"""Integration fixtures: the real app and a real SQLite file, driven by Litestar's test client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from app.config import Settings
from app.server import create_app
from tests.fakes import FakeEngine
from tests.http_helpers import MakeClient


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str:
    """SQLite in the data dir (""), unless a module parametrizes this fixture with
    "postgres" (indirect=True): then an empty schema of the session's PostgreSQL database."""
    if getattr(request, "param", "sqlite") == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return ""


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=str(tmp_path / "data"),
        database_url=database_url,
        max_batch_file_bytes=64 * 1024,
        lease_seconds=5,
    )


@pytest.fixture
def make_client(settings: Settings) -> Iterator[MakeClient]:
    """make_client(engine=None, **settings): the app started on `settings` with these fields
    changed (same data dir) and `engine` (a fresh FakeEngine if None); stopped after the test."""
    with ExitStack() as apps:

        def make(engine: Any = None, **changes: Any) -> TestClient:
            engine = engine if engine is not None else FakeEngine()
            app = create_app(replace(settings, **changes), engine=engine)
            return apps.enter_context(TestClient(app))

        yield make


@pytest.fixture
def client(make_client: MakeClient, engine: FakeEngine) -> TestClient:
    return make_client(engine)
