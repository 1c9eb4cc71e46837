"""The Uploads API through the openai SDK (on Litestar's test client): parts in any order,
complete with md5, cancel, expiry, limits that name themselves, owners kept apart."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import openai
import pytest
from litestar.testing import TestClient
from openai import OpenAI
from openai.types import FileObject, Upload
from openai.types.uploads import UploadPart

from app.config import Settings
from tests.factories import batch_line, jsonl
from tests.http_helpers import MakeClient, batch_getter, wait_for_status


def sdk(client: TestClient, key: str = "unused") -> OpenAI:
    """The SDK over the test client (an httpx.Client), so no port is needed."""
    return OpenAI(
        api_key=key, base_url=str(client.base_url) + "/v1", http_client=client, max_retries=0
    )


def split(data: bytes, n: int) -> list[bytes]:
    step = -(-len(data) // n)
    return [data[i : i + step] for i in range(0, len(data), step)]


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    return dict(body["error"])


def parts_dir(settings: Settings, upload_id: str) -> Path:
    return settings.data_path / "uploads" / upload_id


def test_parts_in_any_order_complete_into_a_file_a_batch_can_run(
    client: TestClient, settings: Settings
) -> None:
    api = sdk(client)
    data = jsonl(*(batch_line(f"u{i}", f"hello {i}") for i in range(6)))
    up = api.uploads.create(
        bytes=len(data), filename="in.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    assert isinstance(up, Upload) and up.status == "pending" and up.file is None
    assert up.expires_at - up.created_at == 3600 and up.bytes == len(data)
    pieces = split(data, 4)
    # Sent last piece first: the order of part_ids is the order of the bytes.
    parts = {i: api.uploads.parts.create(upload_id=up.id, data=pieces[i]) for i in (3, 1, 0, 2)}
    assert all(isinstance(p, UploadPart) and p.upload_id == up.id for p in parts.values())
    assert len(list(parts_dir(settings, up.id).iterdir())) == 4
    done = api.uploads.complete(
        upload_id=up.id,
        part_ids=[parts[i].id for i in range(4)],
        md5=hashlib.md5(data).hexdigest(),
    )
    assert done.status == "completed" and isinstance(done.file, FileObject)
    assert done.file.bytes == len(data) and done.file.purpose == "batch"
    assert done.file.filename == "in.jsonl"
    assert api.files.content(done.file.id).content == data
    assert not parts_dir(settings, up.id).exists()
    b = api.batches.create(
        input_file_id=done.file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    finished = wait_for_status(batch_getter(client), b.id, ("completed",))
    assert finished["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    # A completed upload takes nothing more.
    with pytest.raises(openai.BadRequestError) as again:
        api.uploads.cancel(upload_id=up.id)
    assert error_of(again.value)["code"] == "upload_completed"


def test_the_sdks_chunked_helper(client: TestClient, tmp_path: Path) -> None:
    api = sdk(client)
    path = tmp_path / "notes.txt"
    path.write_bytes(b"0123456789" * 1000)
    up = api.uploads.upload_file_chunked(
        file=path, mime_type="text/plain", purpose="user_data", part_size=3000
    )
    assert up.status == "completed" and up.file is not None and up.file.bytes == 10_000
    assert api.files.content(up.file.id).content == path.read_bytes()


def test_md5_and_byte_count_are_checked(client: TestClient) -> None:
    api = sdk(client)
    data = b"abcdefgh" * 100
    up = api.uploads.create(
        bytes=len(data), filename="x.bin", mime_type="application/octet-stream", purpose="user_data"
    )
    first = api.uploads.parts.create(upload_id=up.id, data=data[:500])
    with pytest.raises(openai.BadRequestError) as short:
        api.uploads.complete(upload_id=up.id, part_ids=[first.id])
    err = error_of(short.value)
    assert err["code"] == "upload_size_mismatch" and err["param"] == "part_ids"
    assert "500 bytes" in err["message"] and f"bytes={len(data)}" in err["message"]
    with pytest.raises(openai.BadRequestError) as over:
        api.uploads.parts.create(upload_id=up.id, data=data)
    assert error_of(over.value)["code"] == "upload_too_large"
    second = api.uploads.parts.create(upload_id=up.id, data=data[500:])
    with pytest.raises(openai.BadRequestError) as bad_md5:
        api.uploads.complete(upload_id=up.id, part_ids=[first.id, second.id], md5="0" * 32)
    err = error_of(bad_md5.value)
    assert err["code"] == "md5_mismatch" and err["param"] == "md5"
    with pytest.raises(openai.BadRequestError) as unknown:
        api.uploads.complete(upload_id=up.id, part_ids=[first.id, "part_nope"])
    assert "part_nope" in error_of(unknown.value)["message"]
    # Still pending after those refusals: the right md5 completes it.
    done = api.uploads.complete(
        upload_id=up.id, part_ids=[first.id, second.id], md5=hashlib.md5(data).hexdigest()
    )
    assert done.file is not None and api.files.content(done.file.id).content == data


def test_limits_name_themselves(make_client: MakeClient) -> None:
    client = make_client(max_upload_part_bytes=1024)
    api = sdk(client)
    with pytest.raises(openai.BadRequestError) as big:
        api.uploads.create(
            bytes=64 * 1024 + 1, filename="in.jsonl", mime_type="application/jsonl", purpose="batch"
        )
    err = error_of(big.value)
    assert err["param"] == "bytes" and "max_batch_file_bytes" in err["message"]
    assert str(64 * 1024) in err["message"]
    up = api.uploads.create(
        bytes=4096, filename="x.bin", mime_type="application/octet-stream", purpose="user_data"
    )
    with pytest.raises(openai.APIStatusError) as part:
        api.uploads.parts.create(upload_id=up.id, data=b"x" * 1025)
    assert part.value.status_code == 413
    err = error_of(part.value)
    assert err["code"] == "part_too_large" and err["param"] == "data"
    assert "1024 bytes" in err["message"] and "max_upload_part_bytes" in err["message"]
    for body, param in (
        ({"filename": "a", "purpose": "batch", "mime_type": "x"}, "bytes"),
        ({"bytes": 3, "filename": "a", "purpose": "nope", "mime_type": "x"}, "purpose"),
        ({"bytes": 0, "filename": "a", "purpose": "batch", "mime_type": "x"}, "bytes"),
    ):
        r = client.post("/v1/uploads", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = client.post(f"/v1/uploads/{up.id}/parts", content=b"raw")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type"
    assert client.post("/v1/uploads/upload_nope/cancel").status_code == 404


def test_cancel_and_expiry_remove_the_parts(client: TestClient, settings: Settings) -> None:
    api = sdk(client)
    services = client.app.state.services
    kept = {}
    for name in ("cancelled", "expired"):
        up = api.uploads.create(
            bytes=10,
            filename=f"{name}.bin",
            mime_type="application/octet-stream",
            purpose="user_data",
        )
        kept[name] = (up, api.uploads.parts.create(upload_id=up.id, data=b"12345"))
        assert parts_dir(settings, up.id).is_dir()
    up, _ = kept["cancelled"]
    assert api.uploads.cancel(upload_id=up.id).status == "cancelled"
    assert not parts_dir(settings, up.id).exists()
    with pytest.raises(openai.BadRequestError) as late:
        api.uploads.parts.create(upload_id=up.id, data=b"67890")
    assert error_of(late.value)["code"] == "upload_cancelled"

    up, part = kept["expired"]
    leftover = settings.data_path / "uploads" / "upload_left-by-a-crash"
    leftover.mkdir()
    # Timed from the upload's own expires_at, not now(): a second may tick meanwhile.
    assert services.uploads.sweep_expired(up.expires_at - 1) == 0
    assert not leftover.exists() and parts_dir(settings, up.id).is_dir()
    assert services.uploads.sweep_expired(up.expires_at) == 1
    assert not parts_dir(settings, up.id).exists()
    with pytest.raises(openai.BadRequestError) as expired:
        api.uploads.complete(upload_id=up.id, part_ids=[part.id])
    assert error_of(expired.value)["code"] == "upload_expired"


def test_an_upload_belongs_to_its_key(make_client: MakeClient) -> None:
    client = make_client(api_keys=["key-one-aaaa", "key-two-bbbb"])
    one, two = sdk(client, "key-one-aaaa"), sdk(client, "key-two-bbbb")
    up = one.uploads.create(bytes=3, filename="a.txt", mime_type="text/plain", purpose="user_data")
    with pytest.raises(openai.NotFoundError):
        two.uploads.parts.create(upload_id=up.id, data=b"abc")
    part = one.uploads.parts.create(upload_id=up.id, data=b"abc")
    with pytest.raises(openai.NotFoundError):
        two.uploads.complete(upload_id=up.id, part_ids=[part.id])
    done = one.uploads.complete(upload_id=up.id, part_ids=[part.id])
    assert done.file is not None
    with pytest.raises(openai.NotFoundError):
        two.files.retrieve(done.file.id)


def test_files_and_upload_parts_refuse_a_body_alike(make_client: MakeClient) -> None:
    """POST /v1/files and an upload's parts receive through one helper: the same refusals,
    each naming its own file field."""
    client = make_client(max_upload_part_bytes=1024, max_file_bytes=1024)
    up = sdk(client).uploads.create(
        bytes=10, filename="x.bin", mime_type="application/octet-stream", purpose="user_data"
    )
    targets = {"/v1/files": "file", f"/v1/uploads/{up.id}/parts": "data"}
    for path, field in targets.items():
        r = client.post(path, content=b"raw", headers={"content-type": "text/plain"})
        assert r.status_code == 400, (path, r.text)
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (
            "invalid_content_type",
            field,
        )
        r = client.post(path, files={"other": ("a", b"x")}, data={"purpose": "user_data"})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (path, r.text)
        r = client.post(path, files={field: ("a.bin", b"x" * 2048)}, data={"purpose": "user_data"})
        assert r.status_code == 413 and r.json()["error"]["param"] == field, (path, r.text)
        assert "1024 bytes" in r.json()["error"]["message"]
    r = client.post("/v1/uploads/upload_nope/parts", files={"data": ("a", b"x")})
    assert r.status_code == 404 and r.json()["error"]["param"] == "upload_id", r.text
