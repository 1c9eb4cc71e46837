"""Fair shares in the claim: round-robin between owners, within an owner between its batches,
oldest line first inside a batch; on a real SQLite file and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.tables import BatchStatus
from tests.factories import batch_line
from tests.fakes import HangingEngine
from tests.unit.helpers import batch, make_batch, services


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "sqlite":
        return {}
    return {"database_url": request.getfixturevalue("postgres_url")}


def lines(prefix: str, n: int) -> list[dict[str, Any]]:
    return [batch_line(f"{prefix}{i}", f"HANG {prefix}{i}") for i in range(n)]


def test_owners_then_batches_take_turns(tmp_path: Path, database: dict[str, Any]) -> None:
    eng = HangingEngine(n_slots=3)  # room for 6 lines
    svc = services(tmp_path, eng, **database)
    ids = [
        make_batch(svc, lines("a", 40), owner="key-a"),  # the big, old batch
        make_batch(svc, lines("x", 5), owner="key-a"),  # key A's second batch
        make_batch(svc, lines("b", 5), owner="key-b"),  # key B's, created last
    ]
    for _ in range(3):
        svc.runner._validate_next()
    assert all(batch(svc, i).status == BatchStatus.IN_PROGRESS for i in ids)
    svc.runner._claim_and_submit()
    sent = [body["messages"][-1]["content"].removeprefix("HANG ") for _, body, _ in eng.submitted]
    # Turn 1: A's oldest batch, then B; turn 2: A's other batch, then B; turn 3: A's first
    # batch again, then B. (The runner hands them over grouped by input file.)
    assert sorted(sent) == ["a0", "a1", "b0", "b1", "b2", "x0"]
    eng.close()
