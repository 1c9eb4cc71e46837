"""A running batch's projected finish: the lane's measured rate, fair shares played
forward, and the error recorded when the batch completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.batches.claims.projection import Projections, Running, play, share_of
from app.db import Database
from app.tables import Batch, BatchStatus

HOUR, DAY = 3600, 86400


def test_one_batch_alone_finishes_at_its_lines_over_the_rate() -> None:
    assert play({"a": ("k", 100, None)}, 10.0) == {"a": (pytest.approx(10.0), 0)}


def test_two_owners_split_the_rate_until_the_small_batch_is_done() -> None:
    # Key B's 10 lines get half of 10 lines/s: done in 2 s, with 10 of A's lines played
    # meanwhile; A then runs alone: 400 lines in all at 10/s.
    out = play({"a": ("A", 400, DAY), "b": ("B", 10, DAY)}, 10.0)
    assert out["b"] == (pytest.approx(2.0), 10)
    assert out["a"] == (pytest.approx(41.0), 10)


def test_an_owners_batches_of_one_deadline_share_its_half() -> None:
    out = play({"a1": ("A", 100, DAY), "a2": ("A", 100, DAY), "b": ("B", 100, DAY)}, 4.0)
    # B gets 2/s, A's two batches 1/s each, until B ends at 50 s; then A's share 2/s each.
    assert out["b"][0] == pytest.approx(50.0)
    assert out["a1"][0] == pytest.approx(75.0) and out["a2"][0] == pytest.approx(75.0)


def test_an_owners_nearest_deadline_takes_its_half_first() -> None:
    # As the claims serve them: A's 1-hour batch takes all of A's half (2/s) and ends at
    # 25 s; then A's 24-hour batch has it. B's batch has its half throughout.
    out = play({"day": ("A", 100, DAY), "hour": ("A", 50, HOUR), "b": ("B", 100, DAY)}, 4.0)
    assert out["hour"] == (pytest.approx(25.0), 50)  # 50 of B's lines meanwhile
    assert out["b"][0] == pytest.approx(50.0)
    # At 50 s: 50 of day's done; then it runs alone, 50 more at 4/s.
    assert out["day"][0] == pytest.approx(62.5)
    # A batch with no deadline comes after every one with one.
    later = play({"none": ("A", 10, None), "day": ("A", 10, DAY)}, 1.0)
    assert later["day"][0] == pytest.approx(10.0) and later["none"][0] == pytest.approx(20.0)


def test_the_share_now_follows_the_deadlines() -> None:
    hour = Running("hour", "A", "m", 50, 0, 0, HOUR)
    day = Running("day", "A", "m", 100, 0, 0, DAY)
    b = Running("b", "B", "m", 100, 0, 0, DAY)
    assert [share_of(x, [hour, day, b]) for x in (hour, day, b)] == [0.5, 0.0, 0.5]


def row(bid: str, owner: str, total: int, done: int, started: int) -> Running:
    return Running(bid, owner, "m", total, done, started, started + 3600)


def test_the_rate_is_measured_over_the_samples_and_shared(tmp_path: Path) -> None:
    p = Projections(Database(f"sqlite:///{tmp_path / 'p.db'}"))
    t0 = 1_000_000.0
    p.project([row("a", "A", 1000, 0, int(t0)), row("b", "B", 200, 0, int(t0))], t0)
    assert p.get("a") is not None and p.get("a").finish_at is None  # type: ignore[union-attr]
    # 20 lines a second between them, 10 each.
    for i in range(1, 11):
        p.project(
            [row("a", "A", 1000, 10 * i, int(t0)), row("b", "B", 200, 10 * i, int(t0))], t0 + i
        )
    a, b = p.get("a"), p.get("b")
    assert a is not None and b is not None
    assert a.rate == pytest.approx(20.0) and a.share == 0.5
    # At t0+10: b has 100 lines left, a 900; they split 20/s until b ends 10 s on (100 of
    # a's lines played meanwhile), then a runs alone: 800 more at 20/s.
    assert b.finish_at == pytest.approx(t0 + 20) and b.ahead == 100
    assert a.finish_at == pytest.approx(t0 + 20 + 800 / 20) and a.ahead == 100
    assert a.deadline == int(t0) + 3600 and not a.late


def test_a_completed_batch_records_how_far_its_projection_was_off(tmp_path: Path) -> None:
    p = Projections(Database(f"sqlite:///{tmp_path / 'p.db'}"))
    t0 = 2_000_000.0
    for i in range(6):
        p.project([row("a", "A", 100, 10 * i, int(t0))], t0 + i)
    made = p.get("a")
    assert made is not None and made.finish_at == pytest.approx(t0 + 5 + 50 / 10)
    p.project([], t0 + 6)  # it left in_progress: finalizing
    b = Batch(
        id="a",
        endpoint="/v1/chat/completions",
        input_file_id="f",
        status=BatchStatus.COMPLETED,
        finalizing_at=int(t0 + 12),
    )
    p.ended(None, b)  # type: ignore[arg-type]
    (e,) = p.errors
    assert e.batch_id == "a" and e.finished_at == t0 + 12
    assert e.half is not None
    # Half-way (50 of 100 at t0+5) it said t0+10; it finished at t0+12: 2 s early.
    assert e.half[0] == pytest.approx(-2.0) and e.half[1] == pytest.approx(7.0)
    assert e.first is not None


def test_batches_are_grouped_by_their_route_not_the_name_written(tmp_path: Path) -> None:
    # `llama3` and `llama3:latest` are one model (one route): one lane, one rate shared
    # by the two owners; a batch of another route has its own.
    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    db.migrate()
    t0 = 3_000_000
    spelled = {"a": ("A", "llama3", "llama3:latest"), "b": ("B", "llama3:latest", "llama3:latest")}
    with db.write() as s:
        for bid, (owner, model, route) in {**spelled, "c": ("C", "other", "other")}.items():
            s.add(
                Batch(
                    id=bid,
                    owner=owner,
                    endpoint="/v1/chat/completions",
                    input_file_id="f",
                    status=BatchStatus.IN_PROGRESS,
                    model=model,
                    route=route,
                    total=100,
                    in_progress_at=t0,
                    expires_at=t0 + HOUR,
                )
            )
    p = Projections(db)
    p.sample(t0 + 1, force=True)
    with db.write() as s:
        for bid in ("a", "b", "c"):
            batch = s.get(Batch, bid)
            assert batch is not None
            batch.completed = 10
    p.sample(t0 + 11, force=True)
    a, b, c = p.get("a"), p.get("b"), p.get("c")
    assert a is not None and b is not None and c is not None
    assert a.share == b.share == 0.5 and c.share == 1.0
    assert a.rate == b.rate == pytest.approx(2.0)  # 20 lines of one route in 10 s
    assert c.rate == pytest.approx(1.0)
