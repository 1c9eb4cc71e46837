"""A full disk while writing a batch's output: retried, then failed with a message; never half-written."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.files.storage import PartialWrite, data_dir_problem
from app.services import Services, build_services
from app.tables import BatchStatus, RequestStatus
from tests.factories import batch_line
from tests.fakes import FakeEngine
from tests.unit.helpers import (
    batch,
    drive,
    file_lines,
    file_rows,
    make_batch,
    request_rows,
)


def retrying(tmp_path: Path, *delays: float) -> Services:
    """Services whose runner waits `delays` before each retry of a failed output write."""
    return build_services(
        Settings(data_dir=str(tmp_path)), FakeEngine(), finalize_retry_delays=delays
    )


def full_disk(times: int | None) -> Any:
    """A PartialWrite.write that raises ENOSPC (the first `times` calls, or always)."""
    real = PartialWrite.write
    calls = {"n": 0}

    def write(self: PartialWrite, chunk: bytes) -> None:
        calls["n"] += 1
        if times is None or calls["n"] <= times:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.tmp_path))
        real(self, chunk)

    return write, calls


def test_output_that_cannot_be_written_fails_the_batch_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = retrying(tmp_path, 0.0, 0.0)
    batch_id = make_batch(svc, [batch_line("a", "hi"), batch_line("b", "FAIL")])
    input_file = batch(svc, batch_id).input_file_id
    write, calls = full_disk(None)
    monkeypatch.setattr(PartialWrite, "write", write)
    b = drive(svc, batch_id)
    assert b.status == BatchStatus.FAILED and b.failed_at is not None
    assert calls["n"] == 3  # the first try and two retries
    assert b.output_file_id is None and b.error_file_id is None
    (err,) = json.loads(b.errors_json or "[]")
    assert err["code"] == "output_write_failed"
    assert "No space left on device" in err["message"] and "3 times" in err["message"]
    # Nothing half-written is left, and no file row points at missing bytes.
    assert [f.id for f in file_rows(svc)] == [input_file]
    assert [p.name for p in svc.storage.files_dir.iterdir()] == [input_file]
    assert list(svc.storage.tmp_dir.iterdir()) == []
    # The lines' results are still on their rows.
    assert sorted(r.status for r in request_rows(svc, batch_id)) == [
        RequestStatus.FAILED,
        RequestStatus.SUCCEEDED,
    ]


def test_disk_freed_before_the_retries_run_out_completes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = retrying(tmp_path, 0.0, 0.0)
    batch_id = make_batch(
        svc, [batch_line("a", "hi"), batch_line("b", "FAIL"), batch_line("c", "yo")]
    )
    write, _calls = full_disk(2)
    monkeypatch.setattr(PartialWrite, "write", write)
    b = drive(svc, batch_id)
    assert b.status == BatchStatus.COMPLETED and b.errors_json is None
    assert [o["custom_id"] for o in file_lines(svc, b.output_file_id)] == ["a", "c"]
    assert [e["custom_id"] for e in file_lines(svc, b.error_file_id)] == ["b"]
    assert len([f for f in file_rows(svc) if f.purpose == "batch_output"]) == 2
    assert len(list(svc.storage.files_dir.iterdir())) == 3
    assert list(svc.storage.tmp_dir.iterdir()) == []


def test_retry_waits_for_its_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = retrying(tmp_path, 3600.0)
    batch_id = make_batch(svc, [batch_line("a", "hi")])
    write, calls = full_disk(None)
    monkeypatch.setattr(PartialWrite, "write", write)
    for _ in range(5):
        svc.runner.step()
    assert calls["n"] == 1
    assert batch(svc, batch_id).status == BatchStatus.FINALIZING


def test_data_dir_problem(tmp_path: Path) -> None:
    assert data_dir_problem(tmp_path / "new" / "dir") is None
    assert (tmp_path / "new" / "dir").is_dir() and list((tmp_path / "new" / "dir").iterdir()) == []
    regular = tmp_path / "a-file"
    regular.write_text("x")
    problem = data_dir_problem(regular / "data")
    assert problem is not None and str(regular / "data") in problem and "Not a directory" in problem
