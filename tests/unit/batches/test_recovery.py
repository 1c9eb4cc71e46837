"""Crash recovery at the runner level: a kill during validation, running or finalizing.

A "crash" is an exception no code catches (a BaseException, as a kill would be), raised at
the worst moment; then a fresh Runner on the same SQLite file and data dir carries on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import app.batches.lifecycle.lifecycle as lifecycle_module
import app.batches.lifecycle.output as output_module
from app.batches.claims.claims import MAX_ATTEMPTS
from app.tables import BatchStatus, RequestStatus
from tests.factories import batch_line
from tests.fakes import FakeEngine, HangingEngine
from tests.unit.helpers import (
    batch,
    drive,
    file_lines,
    file_rows,
    make_batch,
    request_rows,
    services,
)
from tests.waiting import until


class Crash(BaseException):
    """Stands in for kill -9: nothing between here and the top catches it."""


def test_crash_during_validation_leaves_nothing_and_validation_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 300
    svc = services(tmp_path, FakeEngine(n_slots=64))
    batch_id = make_batch(svc, [batch_line(f"c{i}", f"line {i}") for i in range(n)])
    real_insert = lifecycle_module.insert_lines
    calls = 0

    def insert_then_crash(*a: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        real_insert(*a, **kw)  # every line written in the transaction...
        raise Crash()  # ...and the node dies before it commits

    monkeypatch.setattr(lifecycle_module, "insert_lines", insert_then_crash)
    with pytest.raises(Crash):
        svc.runner.step()
    assert calls == 1
    # Nothing was committed: the batch is still validating with no lines.
    assert batch(svc, batch_id).status == BatchStatus.VALIDATING
    assert request_rows(svc, batch_id) == []
    svc.db.close()

    monkeypatch.setattr(lifecycle_module, "insert_lines", real_insert)
    svc2 = services(tmp_path, FakeEngine(n_slots=64))
    b = drive(svc2, batch_id, timeout=60)
    assert b.status == BatchStatus.COMPLETED
    assert (b.total, b.completed, b.failed) == (n, n, 0)
    out = file_lines(svc2, b.output_file_id)
    assert len(out) == n
    assert sorted(o["custom_id"] for o in out) == sorted(f"c{i}" for i in range(n))
    assert all(r.attempts == 1 for r in request_rows(svc2, batch_id))


def test_crash_between_output_bytes_and_commit_finishes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = services(tmp_path, FakeEngine())
    lines = [batch_line(f"c{i}", "FAIL please" if i % 4 == 0 else f"hello {i}") for i in range(12)]
    batch_id = make_batch(svc, lines)
    real_write = output_module.write_results

    def write_then_crash(*a: Any, **kw: Any) -> Any:
        real_write(*a, **kw)  # the bytes are on disk under fresh ids...
        raise Crash()  # ...and the process dies before the transaction that names them

    monkeypatch.setattr(output_module, "write_results", write_then_crash)
    with pytest.raises(Crash):
        drive(svc, batch_id)
    b = batch(svc, batch_id)
    assert b.status == BatchStatus.FINALIZING
    assert b.output_file_id is None and b.error_file_id is None
    on_disk = {p.name for p in svc.storage.files_dir.iterdir()}
    assert len(on_disk) == 3  # the input and two orphans
    # A write the kill cut short leaves a temporary file behind too.
    (svc.storage.tmp_dir / "upload-deadbeef").write_bytes(b'{"half": ')
    svc.db.close()

    monkeypatch.setattr(output_module, "write_results", real_write)
    svc2 = services(tmp_path, FakeEngine())
    svc2.runner.start()  # start() sweeps what the crash left, then runs the loop
    try:
        until(
            lambda: batch(svc2, batch_id).status,
            20,
            "the recovered batch to finish",
            accept=lambda status: status in BatchStatus.FINISHED,
        )
    finally:
        svc2.runner.stop()
    b = batch(svc2, batch_id)
    assert b.status == BatchStatus.COMPLETED
    outputs = [f for f in file_rows(svc2) if f.purpose == "batch_output"]
    assert sorted(f.id for f in outputs) == sorted([b.output_file_id, b.error_file_id])
    # Only named files remain: the input, one output file, one error file.
    assert {p.name for p in svc2.storage.files_dir.iterdir()} == {f.id for f in file_rows(svc2)}
    assert list(svc2.storage.tmp_dir.iterdir()) == []
    out, err = file_lines(svc2, b.output_file_id), file_lines(svc2, b.error_file_id)
    assert (len(out), len(err)) == (9, 3)
    assert (b.completed, b.failed, b.total) == (9, 3, 12)
    seen = [x["custom_id"] for x in out + err]
    assert sorted(seen) == sorted(x["custom_id"] for x in lines)
    assert all(e["response"]["status_code"] == 400 for e in err)
    assert {e["response"]["body"]["error"]["code"] for e in err} == {"context_length_exceeded"}


def test_dead_runners_claims_are_taken_over_and_its_late_results_ignored(tmp_path: Path) -> None:
    dead_engine = HangingEngine()
    dead = services(tmp_path, dead_engine, lease_seconds=1)
    lines = [batch_line(f"c{i}", f"HANG {i}" if i < 3 else f"hi {i}") for i in range(6)]
    batch_id = make_batch(dead, lines)
    dead.runner.step()  # validate, claim all six: three hang in the "dead" runner's engine
    dead.runner.step()  # record the three that finished
    running = [r for r in request_rows(dead, batch_id) if r.status == RequestStatus.RUNNING]
    assert len(running) == 3 and all(r.attempts == 1 for r in running)
    time.sleep(1.2)  # the dead runner renews nothing: its leases run out

    alive = services(tmp_path, FakeEngine(), lease_seconds=1)
    b = drive(alive, batch_id)
    assert b.status == BatchStatus.COMPLETED and (b.completed, b.failed) == (6, 0)
    rows = {r.custom_id: r for r in request_rows(alive, batch_id)}
    assert [rows[f"c{i}"].attempts for i in range(6)] == [2, 2, 2, 1, 1, 1]
    assert all(r.claimed_by == alive.runner.worker_id for r in rows.values() if r.attempts == 2)

    # The dead runner's engine finally answers: those results are not its to write.
    for fut in dead_engine.hanging:
        fut.set_result(dead_engine.answer("/v1/chat/completions", lines[0]["body"]))
    dead.runner.step()
    after = batch(alive, batch_id)
    assert (after.completed, after.failed) == (6, 0)
    assert len(file_lines(alive, after.output_file_id)) == 6


def test_line_that_keeps_killing_the_server_fails_alone(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine(), lease_seconds=1)
    batch_id = make_batch(svc, [batch_line("poison", "boom"), batch_line("fine", "hi")])
    svc.runner._validate_next()  # only validate: step() would also claim and run
    with svc.db.write() as s:
        # As if the server had died MAX_ATTEMPTS times while running this line.
        for r in request_rows(svc, batch_id):
            if r.custom_id == "poison":
                r.status, r.attempts, r.lease_until = RequestStatus.RUNNING, MAX_ATTEMPTS, 0.0
                s.add(r)
    b = drive(svc, batch_id)
    assert b.status == BatchStatus.COMPLETED and (b.completed, b.failed, b.total) == (1, 1, 2)
    (err,) = file_lines(svc, b.error_file_id)
    assert err["custom_id"] == "poison"
    assert err["response"]["status_code"] == 500
    assert err["response"]["body"]["error"]["code"] == "server_error"
    assert [o["custom_id"] for o in file_lines(svc, b.output_file_id)] == ["fine"]
