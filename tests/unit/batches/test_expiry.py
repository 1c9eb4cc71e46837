"""The completion window and file expiry: what runs out, when, and what the files then hold."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.files import bucket_writes
from app.files.storage import UNFINISHED_MAX_AGE
from app.services import Services, build_services
from app.tables import BatchStatus, File, RequestStatus, now
from app.wire.batches import OutputExpiresAfter
from harness.seaweed import Seaweed, aws_env
from tests.factories import CHAT, batch_line, jsonl_texts
from tests.fakes import HangingEngine, finish
from tests.unit.helpers import (
    batch,
    drive,
    file_lines,
    file_rows,
    make_batch,
    request_rows,
    services,
)


@pytest.fixture(params=["directory", "s3"])
def where(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The settings that put file bytes in the data dir, or in a bucket on SeaweedFS."""
    if request.param == "directory":
        yield {}
        return
    server: Seaweed = request.getfixturevalue("seaweed")
    with aws_env(server):
        prefix = f"expiry-{secrets.token_hex(4)}"
        yield {"files_url": f"s3://{server.bucket}/{prefix}", "s3_endpoint": server.endpoint}


def test_window_running_out_expires_the_batch(tmp_path: Path) -> None:
    # One slot: two hanging lines fill the engine's queue, so the last two never start.
    engine = HangingEngine(n_slots=1)
    svc = services(tmp_path, engine, batch_window_seconds=2)
    lines = [
        batch_line("q0", "hi"),
        batch_line("h1", "HANG"),
        batch_line("q2", "yo"),
        batch_line("h3", "HANG"),
        batch_line("q4", "late"),
        batch_line("q5", "later"),
    ]
    batch_id = make_batch(svc, lines)
    b = drive(svc, batch_id, timeout=15)
    assert b.status == BatchStatus.EXPIRED
    assert b.expires_at == b.created_at + 2
    assert b.expired_at is not None and b.expired_at >= b.expires_at
    assert b.completed_at is None and b.finalizing_at is not None
    out, err = file_lines(svc, b.output_file_id), file_lines(svc, b.error_file_id)
    assert [o["custom_id"] for o in out] == ["q0", "q2"]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    assert [e["custom_id"] for e in err] == ["h1", "h3", "q4", "q5"]
    for e in err:
        assert e["response"] is None
        assert e["error"]["code"] == "batch_expired" and e["error"]["message"]
    assert (b.total, b.completed, b.failed) == (6, len(out), len(err))
    # The two lines in the engine were withdrawn, the two pending ones never submitted.
    assert engine.cancelled == 2
    submitted = [body["messages"][-1]["content"] for _, body, _ in engine.submitted]
    assert "late" not in submitted and "later" not in submitted
    statuses = {r.custom_id: r.status for r in request_rows(svc, batch_id)}
    assert statuses == {
        "q0": RequestStatus.SUCCEEDED,
        "q2": RequestStatus.SUCCEEDED,
        "h1": RequestStatus.EXPIRED,
        "h3": RequestStatus.EXPIRED,
        "q4": RequestStatus.EXPIRED,
        "q5": RequestStatus.EXPIRED,
    }
    # A late answer from the engine changes nothing.
    for fut in engine.hanging:
        assert fut.done()
    svc.runner.step()
    assert (batch(svc, batch_id).completed, batch(svc, batch_id).failed) == (2, 4)


def test_batch_inside_its_window_completes(tmp_path: Path) -> None:
    svc = services(tmp_path, HangingEngine(), batch_window_seconds=3600)
    b = drive(svc, make_batch(svc, [batch_line("a", "hi")]))
    assert b.status == BatchStatus.COMPLETED and b.expired_at is None
    assert b.expires_at == b.created_at + 3600


def test_output_expires_after_is_anchored_on_the_output_file(
    tmp_path: Path, where: dict[str, str]
) -> None:
    svc = services(tmp_path, HangingEngine(), **where)
    inp = make_batch(svc, [batch_line("a", "hi")])
    input_file = batch(svc, inp).input_file_id
    b = svc.batches.create(
        "",
        input_file,
        CHAT,
        output_expires_after=OutputExpiresAfter(anchor="created_at", seconds=3600),
    )
    b = drive(svc, b.id)
    assert b.status == BatchStatus.COMPLETED
    out = next(f for f in file_rows(svc) if f.id == b.output_file_id)
    assert out.expires_at == out.created_at + 3600 and out.created_at >= b.created_at
    # Swept when due, not before; the input (30 days) stays.
    assert svc.files.sweep_expired(out.created_at + 3599) == 0
    assert svc.storage.exists(out.id)
    assert svc.files.sweep_expired(out.created_at + 3600) == 1
    assert not svc.storage.exists(out.id)
    left = {f.id for f in file_rows(svc)}
    assert out.id not in left and input_file in left
    assert svc.storage.exists(input_file)


def test_expired_input_of_a_running_batch_waits_for_the_batch(
    tmp_path: Path, where: dict[str, str]
) -> None:
    svc = services(tmp_path, HangingEngine(), **where)
    batch_id = make_batch(svc, [batch_line("h", "HANG")])
    svc.runner.step()
    input_file = batch(svc, batch_id).input_file_id
    later = now() + 31 * 24 * 3600
    # Expired like a delete: gone from the API at once, its bytes kept for the batch.
    assert svc.files.sweep_expired(later) == 0
    assert svc.storage.exists(input_file)
    assert input_file not in {f.id for f in svc.files.list("")[0]}
    svc.batches.cancel(batch_id, "")
    assert drive(svc, batch_id).status == BatchStatus.CANCELLED
    # The runner releases the bytes as the batch ends (a sweep would, if it had not).
    svc.files.sweep_expired(later)
    assert not svc.storage.exists(input_file)
    assert input_file not in {f.id for f in file_rows(svc)}


def test_a_deleted_input_is_still_read_by_its_running_batch(
    tmp_path: Path, where: dict[str, str]
) -> None:
    engine = HangingEngine(n_slots=1)
    svc = services(tmp_path, engine, **where)
    lines = [batch_line("h", "HANG")] + [batch_line(f"l{i}", f"line {i}") for i in range(3)]
    batch_id = make_batch(svc, lines)
    svc.runner.step()
    input_file = batch(svc, batch_id).input_file_id
    assert len(engine.submitted) < len(lines)  # the other lines are read later
    assert svc.files.delete(input_file, "") is False  # gone from the API, bytes kept
    assert svc.storage.exists(input_file)
    finish(engine)
    done = drive(svc, batch_id)
    assert done.status == BatchStatus.COMPLETED and done.output_file_id
    with svc.storage.open_file(done.output_file_id) as fh:
        out = jsonl_texts(fh.read())
    assert len(out) == len(lines)
    assert [r.status for r in request_rows(svc, batch_id)] == [RequestStatus.SUCCEEDED] * 4
    assert not svc.storage.exists(input_file)  # released as the batch ended
    assert input_file not in {f.id for f in file_rows(svc)}


def test_runner_sweeps_on_its_interval(tmp_path: Path) -> None:
    def expired_output(svc: Services) -> str:
        """Run a batch (its first step sweeps), then let its output file expire."""
        b = drive(svc, make_batch(svc, [batch_line("a", "hi")]))
        assert b.output_file_id is not None
        with svc.db.write() as s:
            row = s.get(File, b.output_file_id)
            assert row is not None
            row.expires_at = now() - 1
            s.add(row)
        svc.runner.step()
        return b.output_file_id

    hourly = build_services(
        Settings(data_dir=str(tmp_path / "hourly")), HangingEngine(), sweep_interval=3600.0
    )
    out = expired_output(hourly)  # the interval has not passed since the last sweep
    assert hourly.storage.path(out).is_file()
    always = build_services(
        Settings(data_dir=str(tmp_path / "always")), HangingEngine(), sweep_interval=0.0
    )
    out = expired_output(always)
    assert not always.storage.path(out).is_file()
    assert out not in {f.id for f in file_rows(always)}


def test_the_runner_sweeps_unfinished_writes_once_a_day_old(
    tmp_path: Path, where: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = build_services(
        Settings(data_dir=str(tmp_path), **where), HangingEngine(), sweep_interval=0.0
    )
    ages: list[float] = []
    sweep = svc.storage.sweep_unfinished

    def recorded(min_age: float) -> int:
        ages.append(min_age)
        return sweep(min_age)

    monkeypatch.setattr(svc.storage, "sweep_unfinished", recorded)
    writing = svc.storage.begin_write(10**9)  # a write in progress, on S3 a multipart upload
    monkeypatch.setattr(bucket_writes, "PART_BYTES", 5 * 1024 * 1024)
    writing.write(secrets.token_bytes(6 * 1024 * 1024))
    svc.runner.step()
    assert ages == [UNFINISHED_MAX_AGE] == [24 * 3600]
    writing.commit(writing.file_id or "file-w")  # the sweep left it alone: it completes
    assert svc.storage.exists(writing.file_id or "file-w")
