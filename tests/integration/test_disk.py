"""Disk trouble through the API and the CLI: a full data dir on every endpoint that writes,
an unusable data dir at startup."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from sqlalchemy import event, text

from app.files.storage import PartialWrite
from tests.factories import batch_line, jsonl
from tests.live import batchyard


def no_space(self: PartialWrite, chunk: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@contextmanager
def full_data_dir(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The data dir full, for files and for the database: a file write fails with ENOSPC,
    and SQLite may not grow the database by a page (it answers SQLITE_FULL, "database or
    disk is full", as it does on a full disk)."""
    monkeypatch.setattr(PartialWrite, "write", no_space)
    engine = client.app.state.services.db.engine
    with engine.connect() as c:
        pages = c.execute(text("PRAGMA page_count")).scalar()

    def capped(dbapi: Any, *_: Any) -> None:
        dbapi.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(engine, "checkout", capped)
    try:
        yield
    finally:
        event.remove(engine, "checkout", capped)
        monkeypatch.undo()
        with engine.connect() as c:  # pooled connections keep the cap: lift it
            c.exec_driver_sql("PRAGMA max_page_count = 4294967294")
        engine.dispose()


def test_every_endpoint_that_writes_answers_a_full_data_dir_with_507(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", jsonl(batch_line("a", "hi")))},
        data={"purpose": "batch"},
    ).json()
    up = client.post(
        "/v1/uploads",
        json={"filename": "b.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "text/jsonl"},
    ).json()
    # A batch whose row cannot fit the database's free room (its metadata needs new pages).
    batch = {
        "input_file_id": f["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {f"k{i}": "x" * 512 for i in range(16)},
    }
    with full_data_dir(client, monkeypatch):
        answers = {
            "batch": client.post("/v1/batches", json=batch),
            "file": client.post(
                "/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"}
            ),
            "part": client.post(f"/v1/uploads/{up['id']}/parts", files={"data": ("p", b"{}\n")}),
        }
    for what, r in answers.items():
        assert r.status_code == 507, (what, r.text)
        err = r.json()["error"]
        assert err["code"] == "storage_full" and err["type"] == "server_error", what
        assert "No space left on device" in err["message"] or "disk is full" in err["message"]
    assert client.get("/v1/batches").json()["data"] == []
    # The server carries on once there is room again.
    assert client.post("/v1/batches", json=batch).status_code == 200


def test_upload_onto_a_full_disk_is_507_and_leaves_nothing(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PartialWrite, "write", no_space)
    r = client.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert r.status_code == 507, r.text
    err = r.json()["error"]
    assert err["code"] == "storage_full" and "No space left on device" in err["message"]
    assert err["type"] == "server_error"
    data = tmp_path / "data"
    assert list((data / "files").iterdir()) == [] and list((data / "tmp").iterdir()) == []
    monkeypatch.undo()
    # The server carries on once there is room again.
    r = client.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert r.status_code == 200


def test_upload_hitting_another_disk_error_is_500(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: PartialWrite, file_id: str) -> Path:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(PartialWrite, "commit", broken)
    r = client.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "storage_error"
    assert client.get("/v1/files").json()["data"] == []


def serve(data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("serve", "--no-browser", "--port", "0", "--data-dir", str(data_dir), *extra)
    return batchyard(*args, timeout=60)


def test_serve_on_an_unusable_data_dir_exits_with_a_message(tmp_path: Path) -> None:
    regular = tmp_path / "not-a-dir"
    regular.write_text("x")
    for bad in (regular / "data", regular):
        done = serve(bad)
        assert done.returncode == 1, done
        assert f"batchyard: The data dir {bad} is not usable" in done.stderr
        assert "Traceback" not in done.stderr


def test_serve_with_an_unreadable_keys_file_exits_with_a_message(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-keys.txt"
    done = serve(tmp_path / "data", "--api-keys-file", str(missing))
    assert done.returncode == 1, done
    assert f"Cannot read the API keys file {missing}" in done.stderr
    assert "Traceback" not in done.stderr
