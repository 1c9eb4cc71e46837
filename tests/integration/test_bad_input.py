"""Bad input never hurts the server and always says what is wrong, OpenAI-shaped.

The real app on a real SQLite file, driven by the test client; the engine is the fake one
(the engine's own parameter checks are covered end to end in tests/e2e/test_bad_params.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from litestar.testing import TestClient

from app.config import Settings
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.fakes import HangingEngine
from tests.http_helpers import (
    FINISHED,
    MakeClient,
    batch_getter,
    create_batch,
    post_batch,
    post_file,
    upload,
    wait_for_status,
)
from tests.waiting import until

CAP = 4 * 1024 * 1024  # the batch file cap where a test needs big files
CAPS = {"max_batch_file_bytes": CAP, "max_file_bytes": 2 * CAP}


def run(client: TestClient, data: bytes) -> dict[str, Any]:
    f = upload(client, data)
    b = create_batch(client, f["id"])
    return wait_for_status(batch_getter(client), b["id"], FINISHED)


def content(client: TestClient, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    r = client.get(f"/v1/files/{file_id}/content")
    assert r.status_code == 200
    return jsonl_lines(r.text)


def assert_error(r: Any, status: int, code: str | None, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err


def leftovers(settings: Settings) -> list[str]:
    data = settings.data_path
    return sorted(p.name for d in ("files", "tmp") for p in (data / d).iterdir())


# -- uploads ----------------------------------------------------------------------------


def test_file_over_the_cap_is_413_and_leaves_nothing(
    make_client: MakeClient, settings: Settings
) -> None:
    client = make_client(**CAPS)
    big = b'{"x": "' + b"a" * CAP + b'"}\n'
    assert_error(post_file(client, big), 413, "file_too_large", "file")
    assert leftovers(settings) == []
    # The purpose after the file: the bytes are taken under the general cap, then refused.
    boundary = "xyzBOUNDARY"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'.encode()
        + big
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{boundary}--\r\n'.encode()
    )
    r = client.post(
        "/v1/files",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert_error(r, 413, "file_too_large", "file")
    assert leftovers(settings) == []
    assert client.get("/v1/files").json()["data"] == []


def test_declared_length_over_the_cap_is_refused_before_reading(make_client: MakeClient) -> None:
    client = make_client(**CAPS)
    r = client.post(
        "/v1/files",
        content=b"--b--\r\n",
        headers={
            "content-type": "multipart/form-data; boundary=b",
            "content-length": str(10 * CAP),
        },
    )
    assert_error(r, 413, "file_too_large")


def test_purpose_missing_unknown_and_not_multipart(client: TestClient, settings: Settings) -> None:
    data = jsonl(batch_line("a", "hi"))
    assert_error(post_file(client, data, None), 400, "missing_required_parameter", "purpose")
    assert_error(post_file(client, data, "batch_output"), 400, "invalid_value", "purpose")
    assert_error(post_file(client, data, "nonsense"), 400, "invalid_value", "purpose")
    r = client.post("/v1/files", json={"file": "x", "purpose": "batch"})
    assert_error(r, 400, "invalid_content_type", "file")
    r = client.post("/v1/files", data={"purpose": "batch"}, files={"other": ("x", b"1")})
    assert_error(r, 400, "missing_required_parameter", "file")
    r = client.post(
        "/v1/files", content=b"garbage", headers={"content-type": "multipart/form-data; boundary=q"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert leftovers(settings) == []


def test_expires_after_fields(client: TestClient) -> None:
    data = jsonl(batch_line("a", "hi"))
    f = post_file(
        client, data, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    )
    assert f.status_code == 200, f.text
    assert f.json()["expires_at"] == f.json()["created_at"] + 3600
    r = post_file(
        client, data, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "10"}
    )
    assert_error(r, 400, "invalid_value", "expires_after[seconds]")
    r = post_file(
        client, data, **{"expires_after[anchor]": "now", "expires_after[seconds]": "3600"}
    )
    assert_error(r, 400, "invalid_value", "expires_after[anchor]")
    r = post_file(
        client, data, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "x"}
    )
    assert_error(r, 400, "invalid_value", "expires_after[seconds]")
    # OpenAI's default for batch files: 30 days.
    plain = post_file(client, data).json()
    assert plain["expires_at"] == plain["created_at"] + 30 * 24 * 3600


# -- batch input files ------------------------------------------------------------------


def test_not_utf8_fails_the_batch_naming_the_line(client: TestClient) -> None:
    data = (
        jsonl(batch_line("a", "hi"))
        + b'{"custom_id": "b", "x": "\xff\xfe"}\n'
        + jsonl(batch_line("c", "yo"))
    )
    b = run(client, data)
    assert b["status"] == "failed"
    (err,) = b["errors"]["data"]
    assert (err["code"], err["line"]) == ("invalid_encoding", 2)


def test_byte_order_mark_and_crlf_are_accepted(client: TestClient) -> None:
    data = (
        b"\xef\xbb\xbf"
        + jsonl(batch_line("a", "hi")).replace(b"\n", b"\r\n")
        + jsonl(batch_line("b", "yo"))
    )
    b = run(client, data)
    assert b["status"] == "completed", b
    out = content(client, b["output_file_id"])
    assert [o["custom_id"] for o in out] == ["a", "b"]
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo: hi"


def test_a_line_of_megabytes_is_run_like_any_other(make_client: MakeClient) -> None:
    client = make_client(**CAPS)
    text = "word " * (600 * 1024)  # 3 MB of prompt in one line
    b = run(client, jsonl(batch_line("big", text), batch_line("small", "hi")))
    assert b["status"] == "completed"
    assert b["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    out = {o["custom_id"]: o for o in content(client, b["output_file_id"])}
    assert out["big"]["response"]["body"]["choices"][0]["message"]["content"] == "echo: " + text


def test_deeply_nested_json_is_a_line_error_and_a_body_error(make_client: MakeClient) -> None:
    client = make_client(**CAPS)  # the nested line is over the default 64 KiB
    deep = b'{"custom_id": "d", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    b = run(client, jsonl(batch_line("a", "hi")) + deep)
    assert b["status"] == "failed"
    (err,) = b["errors"]["data"]
    assert (err["code"], err["line"]) == ("invalid_json_line", 2)
    r = client.post(
        "/v1/batches",
        content=b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        headers={"content-type": "application/json"},
    )
    assert_error(r, 400, "invalid_json")
    assert client.get("/health").status_code == 200


def test_every_line_error_is_reported_with_its_line(client: TestClient) -> None:
    bad = [
        b"not json",
        b"[1, 2]",
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}).encode(),
        json.dumps({**batch_line("a", "x"), "custom_id": 5}).encode(),
        json.dumps(batch_line("ok", "fine")).encode(),
        json.dumps(batch_line("ok", "dupe")).encode(),
        json.dumps({**batch_line("g", "x"), "method": "GET"}).encode(),
        json.dumps({**batch_line("u", "x"), "url": "/v1/embeddings"}).encode(),
        json.dumps({**batch_line("s", "x", stream=True)}).encode(),
        json.dumps({**batch_line("m", "x"), "body": {"messages": []}}).encode(),
        json.dumps({**batch_line("n", "x"), "body": "text"}).encode(),
    ]
    b = run(client, b"\n".join(bad) + b"\n")
    assert b["status"] == "failed"
    got = [(e["line"], e["code"]) for e in b["errors"]["data"]]
    assert got == [
        (1, "invalid_json_line"),
        (2, "invalid_json_line"),
        (3, "missing_required_parameter"),
        (4, "invalid_custom_id"),
        (6, "duplicate_custom_id"),
        (7, "invalid_method"),
        (8, "invalid_url"),
        (9, "invalid_request"),
        (10, "missing_required_parameter"),
        (11, "invalid_request"),
    ]


def test_empty_file_fails_with_empty_file(client: TestClient) -> None:
    b = run(client, b"\n\n")
    assert b["status"] == "failed"
    assert [e["code"] for e in b["errors"]["data"]] == ["empty_file"]


# -- ids and parameters -----------------------------------------------------------------


def test_unknown_ids_on_every_route(client: TestClient) -> None:
    assert_error(client.get("/v1/files/file-nope"), 404, None, "file_id")
    assert_error(client.delete("/v1/files/file-nope"), 404, None, "file_id")
    assert_error(client.get("/v1/files/file-nope/content"), 404, None, "file_id")
    assert_error(client.get("/v1/files/..%2F..%2Fetc%2Fpasswd/content"), 404, "unknown_url")
    assert_error(client.get("/v1/files/..%2Fbatchyard.db/content"), 404, "unknown_url")
    assert_error(client.get("/v1/files/batchyard.db/content"), 404, None, "file_id")
    assert_error(client.get("/v1/batches/batch_nope"), 404, None, "batch_id")
    assert_error(client.post("/v1/batches/batch_nope/cancel"), 404, None, "batch_id")
    assert_error(client.get("/v1/files?after=file-nope"), 404, None, "after")
    assert_error(client.get("/v1/batches?after=batch_nope"), 404, None, "after")
    r = client.post(
        "/v1/batches",
        json={
            "input_file_id": "file-nope",
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    assert_error(r, 400, "file_not_found", "input_file_id")
    assert_error(client.get("/v1/nothing-here"), 404, "unknown_url")
    assert_error(client.put("/v1/batches"), 405, "method_not_allowed")


@pytest.mark.parametrize("route", ["/v1/files", "/v1/batches"])
@pytest.mark.parametrize("value", ["0", "abc", "-1", "1000000", "1.5"])
def test_bad_limit(client: TestClient, route: str, value: str) -> None:
    r = client.get(f"{route}?limit={value}")
    assert_error(r, 400, "invalid_value", "limit")
    assert "'limit'" in r.json()["error"]["message"]


def test_bad_batch_bodies(client: TestClient) -> None:
    f = upload(client, jsonl(batch_line("a", "hi")))
    good = {
        "input_file_id": f["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    cases: list[tuple[Any, int, str, str | None]] = [
        ({**good, "completion_window": "48h"}, 400, "invalid_value", "completion_window"),
        ({**good, "endpoint": "/v1/images"}, 400, "invalid_value", "endpoint"),
        ({**good, "input_file_id": None}, 400, "missing_required_parameter", "input_file_id"),
        ({**good, "metadata": {"k": "v" * 513}}, 400, "invalid_value", "metadata.k"),
        ({**good, "metadata": [1]}, 400, "invalid_value", "metadata"),
        (
            {**good, "output_expires_after": {"anchor": "created_at", "seconds": 5}},
            400,
            "invalid_value",
            "output_expires_after[seconds]",
        ),
        ([1, 2], 400, "invalid_json", None),
        # Caught by the typed body (BatchCreateParams) before the service: still OpenAI's
        # codes, naming the parameter the way the service does.
        (
            {k: v for k, v in good.items() if k != "endpoint"},
            400,
            "missing_required_parameter",
            "endpoint",
        ),
        ({**good, "endpoint": 5}, 400, "invalid_value", "endpoint"),
        ({**good, "metadata": {"k": 1}}, 400, "invalid_value", "metadata"),
        (
            {**good, "output_expires_after": {"anchor": "created_at"}},
            400,
            "missing_required_parameter",
            "output_expires_after[seconds]",
        ),
        (
            {**good, "output_expires_after": {"anchor": "created_at", "seconds": "soon"}},
            400,
            "invalid_value",
            "output_expires_after[seconds]",
        ),
    ]
    for body, status, code, param in cases:
        assert_error(client.post("/v1/batches", json=body), status, code, param)
    assert_error(
        client.post("/v1/batches", content=b"{oops", headers={"content-type": "application/json"}),
        400,
        "invalid_json",
    )
    assert_error(client.post("/v1/batches", content=b""), 400, "invalid_json")
    upload_other = upload(client, b"hello", "user_data")
    r = client.post("/v1/batches", json={**good, "input_file_id": upload_other["id"]})
    assert_error(r, 400, "invalid_value", "input_file_id")


def test_cancel_of_a_finished_batch_is_400(client: TestClient) -> None:
    b = run(client, jsonl(batch_line("a", "hi")))
    r = client.post(f"/v1/batches/{b['id']}/cancel")
    assert_error(r, 400, "batch_not_cancellable", "batch_id")


# -- deleting files ---------------------------------------------------------------------


def test_deleting_the_input_of_a_running_batch_hides_it_and_keeps_its_bytes_until_the_end(
    make_client: MakeClient, settings: Settings
) -> None:
    client = make_client(HangingEngine())
    f = upload(client, jsonl(batch_line("a", "HANG"), batch_line("b", "hi")))
    b = create_batch(client, f["id"])
    wait_for_status(batch_getter(client), b["id"], ("in_progress",))
    r = client.delete(f"/v1/files/{f['id']}")
    assert r.status_code == 200 and r.json() == {"id": f["id"], "object": "file", "deleted": True}
    # Gone from the API at once, like OpenAI...
    assert_error(client.get(f"/v1/files/{f['id']}"), 404, None)
    assert_error(client.get(f"/v1/files/{f['id']}/content"), 404, None)
    assert f["id"] not in [x["id"] for x in client.get("/v1/files").json()["data"]]
    assert_error(client.delete(f"/v1/files/{f['id']}"), 404, None)
    assert_error(post_batch(client, f["id"]), 400, "file_not_found", "input_file_id")
    # ...but the running batch still reads its bytes.
    stored = settings.data_path / "files" / f["id"]
    assert stored.is_file()

    client.post(f"/v1/batches/{b['id']}/cancel")
    wait_for_status(batch_getter(client), b["id"], ("cancelled",))
    until(lambda: not stored.exists(), 10, f"the cancelled batch's input {stored} to go")
    # The batch still names its input; its output file is still served.
    again = client.get(f"/v1/batches/{b['id']}").json()
    assert again["input_file_id"] == f["id"]
    if again["output_file_id"]:
        assert client.get(f"/v1/files/{again['output_file_id']}/content").status_code == 200


def test_deleting_an_output_file_removes_its_bytes(client: TestClient, settings: Settings) -> None:
    b = run(client, jsonl(batch_line("a", "hi")))
    out = b["output_file_id"]
    assert (settings.data_path / "files" / out).is_file()
    assert client.delete(f"/v1/files/{out}").json()["deleted"] is True
    assert not (settings.data_path / "files" / out).exists()
    assert out not in [x["id"] for x in client.get("/v1/files").json()["data"]]
