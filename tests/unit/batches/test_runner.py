"""The runner's bookkeeping, driven step by step with the fake engine and a real SQLite file."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path

import pytest
from sqlmodel import select

from app.batches.claims.claims import MAX_ATTEMPTS, waiting_lines
from app.batches.claims.pauses import LANE_PAUSE_MIN
from app.files.bucket import StoreError
from app.services import Services
from app.tables import Request, RequestStatus
from tests.factories import batch_line, jsonl_lines
from tests.fakes import FakeEngine, HangingEngine
from tests.unit.helpers import batch, drive, file_lines, make_batch, request_rows, services


def add_batch(svc: Services, n: int, fail: tuple[int, ...] = ()) -> str:
    return make_batch(
        svc, [batch_line(f"c{i}", "FAIL" if i in fail else f"q {i}") for i in range(n)]
    )


def output_ids(svc: Services, file_id: str | None) -> list[str]:
    return [line["custom_id"] for line in file_lines(svc, file_id)]


def requests(svc: Services, batch_id: str) -> list[Request]:
    return sorted(request_rows(svc, batch_id), key=lambda r: r.line)


def test_every_line_lands_once_in_order(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine(n_slots=2))
    bid = add_batch(svc, 9, fail=(4,))
    b = drive(svc, bid)
    assert b.status == "completed", b.status
    assert (b.total, b.completed, b.failed) == (9, 8, 1)
    assert output_ids(svc, b.output_file_id) == [f"c{i}" for i in range(9) if i != 4]
    assert output_ids(svc, b.error_file_id) == ["c4"]
    assert all(r.attempts == 1 for r in requests(svc, bid))
    assert b.in_progress_at and b.finalizing_at and b.completed_at


def test_a_dead_workers_claim_is_taken_again_once_its_lease_runs_out(tmp_path: Path) -> None:
    eng = FakeEngine(n_slots=2)
    svc = services(tmp_path, eng)
    bid = add_batch(svc, 3)
    svc.runner._validate_next()
    with svc.db.write() as s:  # a runner that died while holding line 1
        r = s.exec(select(Request).where(Request.batch_id == bid, Request.line == 1)).one()
        r.status, r.claimed_by, r.lease_until, r.attempts = (
            RequestStatus.RUNNING,
            "dead",
            time.time() + 0.3,
            1,
        )
        s.add(r)
    svc.runner.step()
    assert [b["messages"][0]["content"] for _, b, _ in eng.submitted] == ["q 1", "q 2"]
    time.sleep(0.35)
    b = drive(svc, bid)
    assert b.status == "completed", b.status
    assert b.completed == 3 and sorted(output_ids(svc, b.output_file_id)) == ["c0", "c1", "c2"]
    assert [r.attempts for r in requests(svc, bid)] == [2, 1, 1]


def test_lines_a_dead_node_held_ask_the_model_pool_for_their_model(tmp_path: Path) -> None:
    # A dead node held a batch's last lines and none is pending: the model pool hears of
    # them once their lease ran out, or it never loads their model and the batch hangs.
    svc = services(tmp_path, FakeEngine(n_slots=2))
    bid = add_batch(svc, 3)
    svc.runner._validate_next()
    with svc.db.write() as s:
        rows = s.exec(select(Request).where(Request.batch_id == bid).order_by(Request.line))
        for i, r in enumerate(rows.all()):
            lapsed = i < 2
            r.status, r.claimed_by, r.attempts = RequestStatus.RUNNING, "dead", 1
            r.lease_until = time.time() + (-1 if lapsed else 60)
            s.add(r)
    with svc.db.read() as s:
        assert [n for _, n, _ in waiting_lines(s)] == [2]


def test_a_stale_result_is_not_recorded_twice(tmp_path: Path) -> None:
    eng = FakeEngine(n_slots=2, delay=0.2)
    svc = services(tmp_path, eng)
    bid = add_batch(svc, 1)
    svc.runner._validate_next()
    svc.runner._claim_and_submit()
    with svc.db.write() as s:  # another runner took the line meanwhile and finished it
        r = s.exec(select(Request).where(Request.batch_id == bid)).one()
        r.claimed_by = "other"
        s.add(r)
    time.sleep(0.3)
    svc.runner._record_results()
    b = svc.batches.get(bid, "")
    assert b.completed == 0 and requests(svc, bid)[0].status == RequestStatus.RUNNING


def test_a_line_that_keeps_killing_the_server_fails_alone(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine())
    bid = add_batch(svc, 2)
    svc.runner._validate_next()
    with svc.db.write() as s:
        r = s.exec(select(Request).where(Request.batch_id == bid, Request.line == 1)).one()
        r.status, r.claimed_by, r.lease_until, r.attempts = (
            RequestStatus.RUNNING,
            "dead",
            0.0,
            MAX_ATTEMPTS,
        )
        s.add(r)
    b = drive(svc, bid)
    assert b.status == "completed", b.status
    assert (b.completed, b.failed) == (1, 1)
    err = json.loads(svc.storage.path(b.error_file_id).read_text())
    assert err["custom_id"] == "c0" and err["response"]["status_code"] == 500


def test_cancel_stops_lines_that_have_not_started(tmp_path: Path) -> None:
    # Lines that take a minute: the cancel always comes while both claimed lines are running,
    # however slow the machine (with 0.2 s, a loaded machine finished them first).
    eng = FakeEngine(n_slots=1, delay=60)
    svc = services(tmp_path, eng)
    bid = add_batch(svc, 10)
    svc.runner._validate_next()
    svc.runner.step()  # claims 2 (slots * 2)
    svc.batches.cancel(bid, "")
    b = drive(svc, bid)
    assert b.status == "cancelled", b.status
    assert b.cancelling_at and b.cancelled_at
    assert len(eng.submitted) == 2 and eng.cancelled == 2
    statuses = [r.status for r in requests(svc, bid)]
    assert statuses.count(RequestStatus.CANCELLED) == 10 - b.completed - b.failed
    assert len(output_ids(svc, b.output_file_id)) == b.completed


def test_expired_batch_keeps_finished_lines_and_reports_the_rest(tmp_path: Path) -> None:
    eng = FakeEngine(n_slots=1, delay=0.05)
    svc = services(tmp_path, eng, batch_window_seconds=2)
    bid = add_batch(svc, 200)
    b = drive(svc, bid, timeout=60)
    assert b.expired_at and b.status == "expired"
    done = output_ids(svc, b.output_file_id)
    errs = jsonl_lines(svc.storage.path(b.error_file_id).read_text())
    assert 0 < len(done) < 200 and len(done) + len(errs) == 200 == b.total
    assert (b.completed, b.failed) == (len(done), len(errs))
    assert {e["error"]["code"] for e in errs} == {"batch_expired"} and all(
        e["response"] is None for e in errs
    )
    assert set(done) | {e["custom_id"] for e in errs} == {f"c{i}" for i in range(200)}


@pytest.mark.parametrize("status", ["validating", "in_progress"])
def test_cancel_before_and_during_run(tmp_path: Path, status: str) -> None:
    svc = services(tmp_path, FakeEngine(delay=0.05))
    bid = add_batch(svc, 3)
    if status == "in_progress":
        svc.runner._validate_next()
    svc.batches.cancel(bid, "")
    b = drive(svc, bid)
    assert b.status == "cancelled" and b.output_file_id is None


def test_a_step_woken_by_results_finishes_batches_and_leaves_new_ones_to_the_poll(
    tmp_path: Path,
) -> None:
    """A step without `poll` (the loop woken by results between two polls) records, claims
    and finalizes, but does not look for batches to validate; the next poll does."""
    svc = services(tmp_path, FakeEngine(n_slots=2))
    first = add_batch(svc, 3)
    svc.runner.step()  # a poll: validates the first batch and claims its lines
    second = add_batch(svc, 2)
    deadline = time.time() + 10  # each turn is a step, the work under test: not an until()
    while batch(svc, first).status != "completed":
        assert time.time() < deadline, batch(svc, first).status
        svc.runner.step(poll=False)
    done = batch(svc, first)
    assert (done.completed, done.failed) == (3, 0)
    assert output_ids(svc, done.output_file_id) == ["c0", "c1", "c2"]
    assert batch(svc, second).status == "validating"
    svc.runner.step()
    assert batch(svc, second).status == "in_progress"
    assert drive(svc, second).completed == 2


def test_stop_is_heard_during_the_back_off_after_a_failed_step(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine(n_slots=1))
    failed = threading.Event()

    def boom(*, poll: bool = True) -> None:
        failed.set()
        raise RuntimeError("the database is gone")

    svc.runner.step = boom  # type: ignore[method-assign]
    svc.runner._thread.backoff = 60.0  # far longer than the stop() below may wait
    svc.runner.start()
    assert failed.wait(10)
    svc.runner.stop(timeout=10)
    assert not svc.runner._thread.alive, "the runner slept through stop()"


def test_a_line_whose_store_is_away_waits_and_runs_once_it_is_back(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine(n_slots=2))
    bid = add_batch(svc, 6)
    read, away, asked = svc.storage.read_spans, [True], [0]

    def read_spans(file_id: str, spans: list[tuple[int, int]]) -> list[bytes]:
        if away[0]:
            asked[0] += 1
            raise StoreError(errno.EIO, "the object store did not answer while trying to read")
        return read(file_id, spans)

    svc.runner.storage.read_spans = read_spans  # type: ignore[method-assign]
    deadline = time.time() + 3  # a few turns of the lane's pause
    while time.time() < deadline:
        svc.runner.step()
        time.sleep(0.02)
    b = batch(svc, bid)
    assert b.status == "in_progress" and (b.completed, b.failed) == (0, 0)
    rows = requests(svc, bid)
    assert all(r.status == RequestStatus.PENDING and r.attempts == 0 for r in rows), rows
    # Asked again once a lane pause, not on every step.
    assert 2 <= asked[0] <= 3 / LANE_PAUSE_MIN + 1, asked
    away[0] = False
    b = drive(svc, bid)
    assert b.status == "completed" and (b.completed, b.failed) == (6, 0)
    assert all(r.attempts == 1 for r in requests(svc, bid))


def test_a_line_whose_input_file_is_gone_fails(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine(n_slots=2))
    bid = add_batch(svc, 2)

    def read_spans(file_id: str, spans: list[tuple[int, int]]) -> list[bytes]:
        raise FileNotFoundError(2, "No such object", file_id)

    svc.runner.storage.read_spans = read_spans  # type: ignore[method-assign]
    b = drive(svc, bid)
    assert b.status == "completed" and (b.completed, b.failed) == (0, 2)
    errors = file_lines(svc, b.error_file_id)
    assert all(
        "could not be read again" in e["response"]["body"]["error"]["message"] for e in errors
    )


def test_lines_waiting_for_their_store_end_only_with_the_window(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine(n_slots=2), batch_window_seconds=2)
    bid = add_batch(svc, 4)

    def read_spans(file_id: str, spans: list[tuple[int, int]]) -> list[bytes]:
        raise StoreError(errno.EIO, "the object store did not answer while trying to read")

    svc.runner.storage.read_spans = read_spans  # type: ignore[method-assign]
    b = drive(svc, bid, timeout=15)
    assert b.status == "expired" and (b.completed, b.failed) == (0, 4)
    errors = file_lines(svc, b.error_file_id)
    assert [e["custom_id"] for e in errors] == ["c0", "c1", "c2", "c3"]
    assert all(e["error"]["code"] == "batch_expired" for e in errors)


def test_while_it_runs_lines_the_runner_looks_for_lifecycle_work_once_a_second(
    tmp_path: Path,
) -> None:
    # The look (validate, cancel, expire, finalize) took the engine's cores every 0.25 s;
    # with lines running it waits a second, and the thread still wakes in time for leases.
    eng = HangingEngine(n_slots=1)
    svc = services(tmp_path, eng)
    make_batch(svc, [batch_line(f"c{i}", f"HANG {i}") for i in range(2)])
    runner = svc.runner
    runner._tick()  # a first look: validates and claims
    assert runner.held and runner._thread.interval == 1.0
    looked = runner._last_poll
    runner._tick()  # woken by nothing new at once: records and claims only
    assert runner._last_poll == looked
    runner.settings.lease_seconds = 3
    runner._tick()
    assert runner._thread.interval == 0.5  # twice in each third of a 3 s lease
    eng.close()
