"""Several nodes on one PostgreSQL queue, as runner threads with fake engines in this process.

Each "node" is its own Services (its own engine pool and runner, its own node id) on one
database and one files location, exactly as two `batchyard serve` processes would share
them. The real-process version, with kill -9 and the real model, is
tests/e2e/test_node_killed_mid_batch.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from app.config import Settings
from app.db import Database, DatabaseError
from app.services import Services, build_services
from app.tables import BatchStatus, RequestStatus
from tests.factories import batch_line
from tests.fakes import FakeEngine
from tests.live import ROOT, batchyard, checkout_env
from tests.unit.helpers import batch, file_lines, file_rows, make_batch, request_rows
from tests.waiting import until


def node(data_dir: Path, url: str, name: str, engine: FakeEngine) -> Services:
    settings = Settings(data_dir=str(data_dir), database_url=url, node_name=name, lease_seconds=2)
    return build_services(settings, engine)


def wait_finished(svc: Services, batch_id: str, timeout: float = 60) -> None:
    until(
        lambda: batch(svc, batch_id).status,
        timeout,
        f"batch {batch_id} to finish",
        accept=lambda status: status in BatchStatus.FINISHED,
    )


def test_two_nodes_share_the_lines_and_record_each_once(tmp_path: Path, postgres_url: str) -> None:
    # Lines slow enough that node a alone would take about a second: b, idle, looks for
    # work every POLL_INTERVAL (0.25 s), and with 10 ms lines a had taken all but 8 by then.
    a = node(tmp_path, postgres_url, "a", FakeEngine(delay=0.05, n_slots=4))
    b = node(tmp_path, postgres_url, "b", FakeEngine(delay=0.05, n_slots=4))
    n = 120
    lines = [batch_line(f"c{i}", "FAIL" if i % 10 == 0 else f"hi {i}") for i in range(n)]
    batch_id = make_batch(a, lines)  # made through node a's API services
    assert batch(b, batch_id).status == BatchStatus.VALIDATING  # and seen by node b
    a.runner.start()
    b.runner.start()
    try:
        wait_finished(a, batch_id)
    finally:
        a.runner.stop()
        b.runner.stop()
    done = batch(b, batch_id)
    assert done.status == BatchStatus.COMPLETED
    assert (done.total, done.completed, done.failed) == (n, n - 12, 12)
    out, err = file_lines(b, done.output_file_id), file_lines(b, done.error_file_id)
    ids = Counter(x["custom_id"] for x in out + err)
    assert sorted(ids) == sorted(f"c{i}" for i in range(n)) and set(ids.values()) == {1}
    assert (len(out), len(err)) == (done.completed, done.failed)
    by_node = Counter(r.claimed_by for r in request_rows(a, batch_id))
    assert set(by_node) == {a.runner.worker_id, b.runner.worker_id}, by_node
    assert all(count >= 10 for count in by_node.values()), by_node
    # One node finalized: one output and one error file, no stray bytes from the other.
    outputs = [f for f in file_rows(a) if f.purpose == "batch_output"]
    assert sorted(f.id for f in outputs) == sorted([done.output_file_id, done.error_file_id])
    assert {p.name for p in a.storage.files_dir.iterdir()} == {f.id for f in file_rows(a)}


def test_a_dead_nodes_lines_are_taken_over_when_their_lease_lapses(
    tmp_path: Path, postgres_url: str
) -> None:
    dead_engine = FakeEngine(n_slots=2)
    dead_engine.hang_word = "HANG"  # its engine never answers: a node that stopped dead
    dead = node(tmp_path, postgres_url, "dead", dead_engine)
    lines = [batch_line(f"c{i}", f"HANG {i}") for i in range(4)] + [
        batch_line(f"d{i}", f"hi {i}") for i in range(4)
    ]
    batch_id = make_batch(dead, lines)
    dead.runner.step()  # validate, then claim four lines it will never finish
    held = [r for r in request_rows(dead, batch_id) if r.status == RequestStatus.RUNNING]
    assert len(held) == 4 and {r.claimed_by for r in held} == {dead.runner.worker_id}
    alive = node(tmp_path, postgres_url, "alive", FakeEngine(n_slots=4))
    alive.runner.start()
    try:
        wait_finished(alive, batch_id)
    finally:
        alive.runner.stop()
    # The dead node's engine answers at last: not its lines any more.
    for fut in dead_engine.hanging:
        fut.set_result(dead_engine.answer("/v1/chat/completions", lines[0]["body"]))
    dead.runner.step()
    done = batch(alive, batch_id)
    assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 8, 0)
    rows = request_rows(alive, batch_id)
    assert {r.claimed_by for r in rows} == {alive.runner.worker_id}
    assert sorted(r.attempts for r in rows) == [1] * 4 + [2] * 4
    assert len(file_lines(alive, done.output_file_id)) == 8


def test_cancel_on_one_node_stops_the_lines_of_another(tmp_path: Path, postgres_url: str) -> None:
    engine = FakeEngine(n_slots=2)
    engine.hang_word = "HANG"
    runner_node = node(tmp_path, postgres_url, "runs", engine)
    api_node = node(tmp_path, postgres_url, "api", FakeEngine(n_slots=0))
    batch_id = make_batch(api_node, [batch_line(f"c{i}", f"HANG {i}") for i in range(6)])
    runner_node.runner.step()
    api_node.batches.cancel(batch_id, "")
    api_node.runner.step()  # holds none of its lines: must not end the batch under the other
    assert batch(api_node, batch_id).status == BatchStatus.CANCELLING
    for _ in range(3):
        runner_node.runner.step()  # withdraws its lines, records them cancelled, finalizes
    done = batch(api_node, batch_id)
    assert done.status == BatchStatus.CANCELLED
    assert Counter(r.status for r in request_rows(api_node, batch_id)) == {"cancelled": 6}


def test_a_batch_is_validated_by_one_node_while_others_take_the_next(
    tmp_path: Path, postgres_url: str
) -> None:
    a = node(tmp_path, postgres_url, "a", FakeEngine())
    b = node(tmp_path, postgres_url, "b", FakeEngine())
    first = make_batch(a, [batch_line("x", "hi")])
    second = make_batch(a, [batch_line("y", "hi")])
    with a.db.exclusive(f"validate {first}") as mine:  # node a is validating `first`
        assert mine
        b.runner._validate_next()
        assert batch(b, first).status == BatchStatus.VALIDATING and not request_rows(b, first)
        assert batch(b, second).status == BatchStatus.IN_PROGRESS  # b took the next one
        with b.db.exclusive(f"validate {first}") as also:
            assert not also
    b.runner._validate_next()  # a let go (here: without validating): b does it now
    assert batch(b, first).status == BatchStatus.IN_PROGRESS
    assert [r.custom_id for r in request_rows(b, first)] == ["x"]


def test_a_second_process_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'batchyard.db'}"
    db = Database(url)  # this process holds the file
    try:
        other = batchyard("serve", "--no-browser", "--data-dir", str(tmp_path), timeout=60)
        assert other.returncode == 1
        assert "Another batchyard process" in other.stderr and "PostgreSQL" in other.stderr
        worker = batchyard("worker", "--data-dir", str(tmp_path), timeout=60)
        assert worker.returncode == 1 and "Another batchyard process" in worker.stderr
    finally:
        db.close()
    # Once let go, another process takes it, and this one is refused in turn.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(url=url)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=checkout_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DatabaseError, match=f"pid {holder.pid}"):
            Database(url)
    finally:
        holder.communicate("\n", timeout=30)
    Database(url).close()  # the holder exited: the file is free again


HOLDER = """
from app.db import Database
Database({url!r})
print("held", flush=True)
input()
"""
