"""Per-engine claims: each engine behind a node gets its own room in the queue.

A node with the embedded engine and an upstream, driven step by step with fake engines
whose requests hang until the test answers them, on a real SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from app.batches.claims.claims import NO_DEADLINE_PRIORITY, line_priority, risk_room
from app.batches.claims.projection import Running
from app.engine.node import EMBEDDED, UNROUTED, Lane, lanes
from app.engine.registry import EngineRegistry
from app.tables import BatchStatus
from app.wire.endpoints import CHAT
from tests.fakes import FakeEngine, FakeUpstream, HangingEngine, finish
from tests.unit.helpers import (
    drive,
    file_lines,
    hanging_lines,
    make_batch,
    running,
    services,
)

LOCAL = "fake-model"  # the fake embedded engine's own model
REMOTE = "remote-model"


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "sqlite":
        return {}
    return {"database_url": request.getfixturevalue("postgres_url")}


def sent(engine: FakeEngine) -> list[str]:
    """What the engine was handed, in order: each line's prompt without its HANG."""
    return [
        body["messages"][-1]["content"].removeprefix("HANG ") for _, body, _ in engine.submitted
    ]


def test_a_big_older_batch_for_one_engine_leaves_the_other_its_room(
    tmp_path: Path, database: dict[str, Any]
) -> None:
    local = HangingEngine(n_slots=2)  # room 4
    remote = FakeUpstream("remote", [REMOTE], n_slots=3)  # room 6
    svc = services(tmp_path, EngineRegistry(local, [remote]), **database)
    big = make_batch(svc, hanging_lines("e", 40, LOCAL))
    small = make_batch(svc, hanging_lines("r", 10, REMOTE))
    for _ in range(3):  # validates both batches, then claims
        svc.runner.step()
    # The older batch filled only the embedded engine's room; the upstream took its own.
    assert sent(local) == ["e0", "e1", "e2", "e3"]
    assert sent(remote) == [f"r{i}" for i in range(6)]
    assert (running(svc, big), running(svc, small)) == (4, 6)
    svc.runner.step()  # full rooms claim nothing more, however long the queue
    assert (len(local.submitted), len(remote.submitted)) == (4, 6)

    # Two lines come back from the upstream: it takes the next two of its own, not the
    # embedded engine's, whose lines are older.
    assert finish(remote, 2) == 2
    svc.runner.step()
    assert sent(remote)[6:] == ["r6", "r7"] and len(local.submitted) == 4
    assert (running(svc, big), running(svc, small)) == (4, 6)

    # A model the upstream starts to list (its /v1/models changed): a batch validated
    # since is routed to it, and waits for the upstream's room (full now).
    remote.served.append("late-model")
    late = make_batch(svc, hanging_lines("l", 3, "late-model"))
    svc.runner.step()  # validated
    assert running(svc, late) == 0 and len(local.submitted) == 4
    assert finish(remote) == 6
    svc.runner.step()  # the upstream's room is 6 again: its batches' oldest lines first
    assert sent(remote)[8:] == ["r8", "r9", "l0", "l1", "l2"]
    assert (running(svc, big), running(svc, small), running(svc, late)) == (4, 2, 3)

    # Everything lands once.
    local.hang_word = remote.hang_word = None
    finish(local)
    finish(remote)
    for batch_id, n in ((small, 10), (late, 3), (big, 40)):
        b = drive(svc, batch_id)
        assert (b.status, b.completed, b.failed) == (BatchStatus.COMPLETED, n, 0)
        ids = Counter(x["custom_id"] for x in file_lines(svc, b.output_file_id))
        assert len(ids) == n and set(ids.values()) == {1}
    assert Counter(body["model"] for _, body, _ in remote.submitted) == {
        REMOTE: 10,
        "late-model": 3,
    }
    assert {body["model"] for _, body, _ in local.submitted} == {LOCAL}


def test_the_upstreams_batch_is_not_kept_waiting_by_the_embedded_one(
    tmp_path: Path, database: dict[str, Any]
) -> None:
    """And the other way round: a big upstream batch ahead leaves the embedded engine its room."""
    local = HangingEngine(n_slots=1)  # room 2
    remote = FakeUpstream("remote", [REMOTE], n_slots=8)  # room 16
    svc = services(tmp_path, EngineRegistry(local, [remote]), **database)
    big = make_batch(svc, hanging_lines("r", 100, REMOTE))
    small = make_batch(svc, hanging_lines("e", 3, LOCAL))
    for _ in range(3):
        svc.runner.step()
    assert (running(svc, big), running(svc, small)) == (16, 2)
    assert sent(local) == ["e0", "e1"]


def test_one_engine_takes_every_line_as_before(tmp_path: Path) -> None:
    local = HangingEngine(n_slots=3)
    svc = services(tmp_path, EngineRegistry(local, []))
    first = make_batch(svc, hanging_lines("a", 4, "some-other-model"))
    second = make_batch(svc, hanging_lines("b", 4, LOCAL))
    for _ in range(3):
        svc.runner.step()
    # One room of twice the slots, whatever model the lines name; the two batches were
    # validated in one step, so they share it, each its oldest lines first.
    assert sent(local) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert (running(svc, first), running(svc, second)) == (3, 3)


def test_without_the_embedded_engine_unknown_models_fail_without_holding_a_room(
    tmp_path: Path,
) -> None:
    a = FakeUpstream("a", ["model-a"], n_slots=1)
    b = FakeUpstream("b", ["model-b"], n_slots=1)
    svc = services(tmp_path, EngineRegistry(None, [a, b]))
    lost = make_batch(svc, hanging_lines("x", 5, "nobody-serves-this"))
    mine = make_batch(svc, hanging_lines("y", 2, "model-b"))
    for _ in range(3):
        svc.runner.step()
    assert sent(b) == ["y0", "y1"] and sent(a) == []
    done = drive(svc, lost)
    assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 0, 5)
    errors = file_lines(svc, done.error_file_id)
    assert {e["response"]["status_code"] for e in errors} == {404}
    assert {e["response"]["body"]["error"]["code"] for e in errors} == {"model_not_found"}
    assert running(svc, mine) == 2  # still on engine b


def test_the_lanes_follow_the_registrys_routing() -> None:
    local = FakeEngine(n_slots=2)
    assert lanes(local) == [Lane(EMBEDDED, 2)]
    assert lanes(EngineRegistry(local, [])) == [Lane(EMBEDDED, 2)]
    lone = FakeUpstream("lone", ["x"], n_slots=5)
    assert lanes(EngineRegistry(None, [lone])) == [Lane("lone", 5)]
    # The embedded model's own name stays with it although an upstream lists it too; an
    # upstream configured with a name (models=) takes it before one that only lists it.
    a = FakeUpstream("a", ["a1", LOCAL, "shared"], n_slots=3)
    b = FakeUpstream("b", ["b1", "shared"], n_slots=4)
    b.spec = type(b.spec)(name="b", url=b.spec.url, models=("shared",))
    assert lanes(EngineRegistry(local, [a, b])) == [
        Lane("a", 3, frozenset({"a1"})),
        Lane("b", 4, frozenset({"b1", "shared"})),
        Lane(EMBEDDED, 2, frozenset({LOCAL, ""})),  # its model, and names nothing knows
    ]
    # An upstream that serves nothing now has no lane; without the embedded engine the
    # rest is a lane of its own.
    a.served = []
    assert lanes(EngineRegistry(None, [a, b])) == [
        Lane("b", 4, frozenset({"b1", "shared"})),
        Lane(UNROUTED, 7, frozenset({""})),
    ]


def answer(engine: FakeEngine, names: set[str]) -> None:
    """Answer the engine's hanging requests whose prompt (without HANG) is in `names`."""
    with engine._lock:
        hung = list(zip(engine.hanging, engine.hanging_bodies, strict=True))
    for fut, body in hung:
        if body["messages"][-1]["content"].removeprefix("HANG ") in names and not fut.done():
            fut.set_result(engine.answer(CHAT, body))


def test_an_at_risk_batch_goes_ahead_of_shares_into_half_the_room(
    tmp_path: Path, database: dict[str, Any]
) -> None:
    eng = HangingEngine(n_slots=3)  # room 6: at most 3 ahead of shares
    svc = services(tmp_path, eng, **database)
    a = make_batch(svc, hanging_lines("a", 40, LOCAL), owner="key-a")
    b = make_batch(svc, hanging_lines("b", 40, LOCAL), owner="key-b")
    r = make_batch(svc, hanging_lines("r", 40, LOCAL), owner="key-c")
    for _ in range(3):
        svc.runner._validate_next()
    # The lane's measured rate (1 line in 5 s) finishes r's 40 lines long after its
    # deadline, 5 s away; a's and b's 24-hour windows are far enough.
    now = time.time()
    rows = [
        Running(x, owner, LOCAL, 40, 0, int(now) - 10, int(now) + deadline)
        for x, owner, deadline in ((a, "key-a", 86400), (b, "key-b", 86400), (r, "key-c", 5))
    ]
    svc.runner.projections.project(rows, now - 5)
    svc.runner.projections.project([dataclasses.replace(rows[2], done=1), *rows[:2]], now)
    assert svc.runner.projections.at_risk() == {r}

    svc.runner._claim_and_submit()
    # r's first three lines ahead of shares; the other three in turns, r taking its own.
    assert sorted(sent(eng)) == ["a0", "b0", "r0", "r1", "r2", "r3"]
    # a0 and b0 come back. r holds 4 lines, more than half the room: nothing more goes
    # ahead of shares, and the other owners move on.
    answer(eng, {"a0", "b0"})
    svc.runner._record_results(claim=True)
    assert sorted(sent(eng)[6:]) == ["a1", "b1"]
    # r's lines come back: up to half the room goes to it ahead of shares again.
    answer(eng, {"r0", "r1", "r2", "r3"})
    svc.runner._record_results(claim=True)
    assert sorted(sent(eng)[8:]) == ["a2", "r4", "r5", "r6"]
    eng.close()


def test_the_risk_room_is_half_a_lanes_room_less_what_it_holds() -> None:
    assert risk_room(Lane("up", 32, depth=4), 0) == 64
    assert risk_room(Lane("up", 32, depth=4), 60) == 4
    assert risk_room(Lane(EMBEDDED, 1), 0) == 1  # a lane of room 2 still serves its risk
    assert risk_room(Lane(EMBEDDED, 1), 1) == 0


def test_a_lines_priority_follows_the_minutes_to_its_deadline() -> None:
    now = 1_000_000.0
    minutes = [-5, 0, 1.9, 2, 3.9, 4, 59, 64, 1439, 10079]
    got = [line_priority(int(now + m * 60), now) for m in minutes]
    assert got == [1, 1, 1, 2, 2, 3, 6, 7, 11, 14]
    assert line_priority(None, now) == NO_DEADLINE_PRIORITY == 15
    assert sorted(got) == got  # sooner, lower: served first


def test_a_priority_lane_sends_each_line_its_priority(tmp_path: Path) -> None:
    remote = FakeUpstream("remote", [REMOTE], n_slots=2)
    remote.spec = dataclasses.replace(remote.spec, priority=True)
    local = HangingEngine(n_slots=2)
    svc = services(tmp_path, EngineRegistry(local, [remote]))
    make_batch(svc, hanging_lines("r", 3, REMOTE))
    make_batch(svc, hanging_lines("e", 3, LOCAL))
    for _ in range(3):
        svc.runner.step()
    assert {body["priority"] for _, body, _ in remote.submitted} == {11}  # a 24-hour window
    assert all("priority" not in body for _, body, _ in local.submitted)
