"""Fair shares in the claim: round-robin between owners; within an owner the nearest deadline
first, batches of one deadline in turns; oldest line first inside a batch; on a real SQLite
file and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import col

from app.services import Services
from app.tables import Batch, BatchStatus
from app.wire.endpoints import CHAT
from tests.factories import batch_line, jsonl
from tests.fakes import HangingEngine
from tests.unit.helpers import batch, make_batch, services


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "sqlite":
        return {}
    return {"database_url": request.getfixturevalue("postgres_url")}


def lines(prefix: str, n: int) -> list[dict[str, Any]]:
    return [batch_line(f"{prefix}{i}", f"HANG {prefix}{i}") for i in range(n)]


def windowed(svc: Services, prefix: str, n: int, owner: str, window: str) -> str:
    """A batch of `n` hanging lines for `owner`, made with `window` as its completion window."""
    data = jsonl(*lines(prefix, n))
    partial = svc.storage.begin_write(len(data) + 1)
    partial.write(data)
    f = svc.files.create(partial=partial, filename="in.jsonl", purpose="batch", owner=owner)
    return svc.batches.create(owner, f.id, CHAT, completion_window=window).id


def first_claim(svc: Services, eng: HangingEngine, ids: list[str]) -> list[str]:
    """Validate the batches, claim once; what the engine was handed, sorted."""
    for _ in ids:
        svc.runner._validate_next()
    assert all(batch(svc, i).status == BatchStatus.IN_PROGRESS for i in ids)
    svc.runner._claim_and_submit()
    return sorted(
        body["messages"][-1]["content"].removeprefix("HANG ") for _, body, _ in eng.submitted
    )


def test_owners_then_batches_take_turns(tmp_path: Path, database: dict[str, Any]) -> None:
    eng = HangingEngine(n_slots=3)  # room for 6 lines
    svc = services(tmp_path, eng, **database)
    ids = [
        make_batch(svc, lines("a", 40), owner="key-a"),  # the big, old batch
        make_batch(svc, lines("x", 5), owner="key-a"),  # key A's second batch
        make_batch(svc, lines("b", 5), owner="key-b"),  # key B's, created last
    ]
    # Key A's two batches end their window at the same second: they take turns.
    with svc.db.write() as s:
        deadline = batch(svc, ids[0]).expires_at
        s.exec(update(Batch).where(col(Batch.id).in_(ids[:2])).values(expires_at=deadline))
    # Turn 1: A's oldest batch, then B; turn 2: A's other batch, then B; turn 3: A's first
    # batch again, then B. (The runner hands them over grouped by input file.)
    assert first_claim(svc, eng, ids) == ["a0", "a1", "b0", "b1", "b2", "x0"]
    eng.close()


def test_within_an_owner_the_nearest_deadline_goes_first(
    tmp_path: Path, database: dict[str, Any]
) -> None:
    eng = HangingEngine(n_slots=3)  # room for 6 lines
    svc = services(tmp_path, eng, **database)
    ids = [
        windowed(svc, "a", 40, "key-a", "24h"),  # the big, old overnight batch
        windowed(svc, "h", 5, "key-a", "1h"),  # key A's batch needed within the hour
    ]
    # The whole 1-hour batch first, then the 24-hour one's oldest line.
    assert first_claim(svc, eng, ids) == ["a0", "h0", "h1", "h2", "h3", "h4"]
    eng.close()


def test_deadlines_order_each_owners_share_and_no_owner_waits(
    tmp_path: Path, database: dict[str, Any]
) -> None:
    eng = HangingEngine(n_slots=4)  # room for 8 lines
    svc = services(tmp_path, eng, **database)
    ids = [
        windowed(svc, "a", 40, "key-a", "24h"),
        windowed(svc, "b", 40, "key-b", "7d"),
        windowed(svc, "h", 3, "key-a", "1h"),
        windowed(svc, "k", 3, "key-b", "1h"),
    ]
    # Owners alternate, four turns each: in each owner's share its 1-hour batch first, then
    # its longer one; a week-long batch still gets its owner's turns.
    assert first_claim(svc, eng, ids) == ["a0", "b0", "h0", "h1", "h2", "k0", "k1", "k2"]
    eng.close()
