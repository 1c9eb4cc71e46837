"""Fixtures of the batch tests: `node`, a node whose pool holds the default model "a" and "b"
(alias "b-alias"), one loaded at a time, loading fake engines that answer when the test says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services import Services
from tests.fakes import FakeLoads
from tests.unit.helpers import pool_node


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Services, FakeLoads]]:
    loads = FakeLoads()
    svc, pool = pool_node(tmp_path, monkeypatch, loads, "b", "b-alias")
    yield svc, loads
    pool.close()
