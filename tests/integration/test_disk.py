"""Disk trouble through the API and the CLI: a full disk on upload, an unusable data dir at startup."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest
from litestar.testing import TestClient

from app.files.storage import PartialWrite
from tests.live import batchyard


def test_upload_onto_a_full_disk_is_507_and_leaves_nothing(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(self: PartialWrite, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

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
