"""Integration fixtures: the real app and a real SQLite file, driven by Litestar's test client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from app.config import Settings
from app.server import create_app
from tests.fakes import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def settings(tmp_path: Any) -> Settings:
    return Settings(
        data_dir=str(tmp_path / "data"), max_batch_file_bytes=64 * 1024, lease_seconds=5
    )


@pytest.fixture
def client(settings: Settings, engine: FakeEngine) -> Iterator[TestClient]:
    app = create_app(settings, engine=engine)
    with TestClient(app) as c:
        yield c


def wait_for_status(
    client: TestClient, batch_id: str, statuses: tuple[str, ...], timeout: float = 15
) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = client.get(f"/v1/batches/{batch_id}").json()
        if b["status"] in statuses:
            return b
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} stayed {b['status']}, wanted {statuses}")


def create_batch(
    client: TestClient, file_id: str, endpoint: str = "/v1/chat/completions"
) -> dict[str, Any]:
    """POST /v1/batches for a file, as an OpenAI script would; returns the batch object."""
    r = client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"},
    )
    assert r.status_code == 200, r.text
    return r.json()
