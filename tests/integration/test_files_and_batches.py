"""Files and batches through the real app, the fake engine, and SQLite or PostgreSQL."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import batch_getter, create_batch, upload, wait_for_status

# One code path, two databases: each test runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)

# The batch's model is the lines' model, as OpenAI reports it.
LINE = {"model": "gpt-4o-mini", "max_tokens": 8}


def test_upload_retrieve_content_delete(client: TestClient) -> None:
    data = jsonl(batch_line("a", "hello", **LINE))
    f = upload(client, data)
    assert f["object"] == "file" and f["bytes"] == len(data) and f["purpose"] == "batch"
    assert (
        f["filename"] == "in.jsonl"
        and f["status"] == "processed"
        and f["expires_at"] > f["created_at"]
    )
    assert client.get(f"/v1/files/{f['id']}").json() == f
    content = client.get(f"/v1/files/{f['id']}/content")
    assert content.status_code == 200 and content.content == data
    assert "attachment" in content.headers["content-disposition"]
    r = client.delete(f"/v1/files/{f['id']}")
    assert r.json() == {"id": f["id"], "object": "file", "deleted": True}
    r = client.get(f"/v1/files/{f['id']}")
    assert r.status_code == 404 and r.json()["error"]["param"] == "file_id"


def test_file_list_pagination(client: TestClient) -> None:
    ids = [
        upload(client, jsonl(batch_line(str(i), "x", **LINE)), name=f"{i}.jsonl")["id"]
        for i in range(5)
    ]
    page = client.get("/v1/files", params={"limit": 2}).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [f["id"] for f in page["data"]] == ids[::-1][:2]
    nxt = client.get("/v1/files", params={"limit": 2, "after": page["last_id"]}).json()
    assert [f["id"] for f in nxt["data"]] == ids[::-1][2:4]
    asc = client.get("/v1/files", params={"order": "asc"}).json()
    assert [f["id"] for f in asc["data"]] == ids and asc["has_more"] is False
    assert client.get("/v1/files", params={"purpose": "batch_output"}).json()["data"] == []
    for bad in ({"limit": "0"}, {"limit": "abc"}, {"order": "up"}, {"purpose": "nope"}):
        r = client.get("/v1/files", params=bad)
        assert r.status_code == 400, bad
        assert r.json()["error"]["param"] in bad


def test_upload_refusals(client: TestClient) -> None:
    r = client.post(
        "/v1/files",
        files={"file": ("a.jsonl", b"{}", "application/jsonl")},
        data={"purpose": "bogus"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    r = client.post("/v1/files", files={"file": ("a.jsonl", b"{}", "application/jsonl")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_required_parameter"
    r = client.post("/v1/files", content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type"
    big = b"x" * (64 * 1024 + 1)
    r = client.post(
        "/v1/files",
        files={"file": ("big.jsonl", big, "application/jsonl")},
        data={"purpose": "batch"},
    )
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "file_too_large" and "65536 bytes" in err["message"]
    assert client.get("/v1/files").json()["data"] == []


def test_batch_runs_to_completed(client: TestClient) -> None:
    f = upload(
        client,
        jsonl(
            batch_line("one", "first question", **LINE),
            "",
            batch_line("two", "FAIL please", **LINE),
        ).replace(b"\n", b"\r\n"),
    )
    b = create_batch(client, f["id"], metadata={"job": "t"})
    assert b["status"] == "validating" and b["object"] == "batch" and b["metadata"] == {"job": "t"}
    b = wait_for_status(batch_getter(client), b["id"], ("completed", "failed"))
    assert b["status"] == "completed", b
    assert b["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    for stamp in ("created_at", "in_progress_at", "finalizing_at", "completed_at", "expires_at"):
        assert isinstance(b[stamp], int), stamp
    assert b["model"] == "gpt-4o-mini"
    assert b["usage"]["input_tokens"] == 2 and b["usage"]["output_tokens"] == 3
    out = jsonl_lines(client.get(f"/v1/files/{b['output_file_id']}/content").content)
    assert [o["custom_id"] for o in out] == ["one"]
    assert out[0]["response"]["status_code"] == 200 and out[0]["error"] is None
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo: first question"
    assert out[0]["id"].startswith("batch_req_") and out[0]["response"]["request_id"]
    err = jsonl_lines(client.get(f"/v1/files/{b['error_file_id']}/content").content)
    assert [e["custom_id"] for e in err] == ["two"]
    assert err[0]["response"]["status_code"] == 400
    assert err[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    listed = client.get("/v1/files", params={"purpose": "batch_output"}).json()["data"]
    assert {x["id"] for x in listed} == {b["output_file_id"], b["error_file_id"]}


def test_batch_create_refusals(client: TestClient) -> None:
    f = upload(client, jsonl(batch_line("a", "x", **LINE)))
    base = {
        "input_file_id": f["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    cases = [
        ({**base, "input_file_id": "file-nope"}, "input_file_id", "file_not_found"),
        ({**base, "endpoint": "/v1/moderations"}, "endpoint", None),
        ({**base, "completion_window": "48h"}, "completion_window", None),
        ({**base, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", None),
        ({**base, "metadata": {"k" * 65: "v"}}, "metadata", None),
        ({**base, "metadata": {"k": "v" * 513}}, "metadata.k", None),
    ]
    for body, param, code in cases:
        r = client.post("/v1/batches", json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error"
        if code:
            assert err["code"] == code
    r = client.post(
        "/v1/batches", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert client.get("/v1/batches/batch_nope").status_code == 404
    assert client.post("/v1/batches/batch_nope/cancel").status_code == 404


def test_validation_names_every_bad_line(client: TestClient) -> None:
    lines = [
        batch_line("ok", "fine", **LINE),
        "{not json",
        {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}},
        batch_line("ok", "dup", **LINE),
        {**batch_line("g", "x", **LINE), "method": "GET"},
        batch_line("u", "x", url="/v1/completions", **LINE),
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": "text"},
        {
            "custom_id": "m",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": []},
        },
        {
            "custom_id": "o",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "other", "messages": []},
        },
        {
            "custom_id": "s",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "stream": True},
        },
    ]
    f = upload(client, jsonl(*lines))
    b = create_batch(client, f["id"])
    b = wait_for_status(batch_getter(client), b["id"], ("failed",))
    errs = b["errors"]["data"]
    assert [(e["line"], e["code"]) for e in errs] == [
        (2, "invalid_json_line"),
        (3, "missing_required_parameter"),
        (4, "duplicate_custom_id"),
        (5, "invalid_method"),
        (6, "invalid_url"),
        (7, "invalid_request"),
        (8, "missing_required_parameter"),
        (9, "mismatched_model"),
        (10, "invalid_request"),
    ]
    assert isinstance(b["failed_at"], int) and b["output_file_id"] is None


def test_cancel_finished_batch_is_400(client: TestClient) -> None:
    f = upload(client, jsonl(batch_line("a", "x", **LINE)))
    b = create_batch(client, f["id"])
    wait_for_status(batch_getter(client), b["id"], ("completed",))
    r = client.post(f"/v1/batches/{b['id']}/cancel")
    assert r.status_code == 400 and "completed" in r.json()["error"]["message"]


def test_batch_list_pagination(client: TestClient) -> None:
    f = upload(client, jsonl(batch_line("a", "x", **LINE)))
    ids = [create_batch(client, f["id"])["id"] for _ in range(3)]
    p = client.get("/v1/batches", params={"limit": 2}).json()
    assert p["has_more"] is True and [b["id"] for b in p["data"]] == ids[::-1][:2]
    p2 = client.get("/v1/batches", params={"limit": 2, "after": p["last_id"]}).json()
    assert [b["id"] for b in p2["data"]] == [ids[0]] and p2["has_more"] is False
    assert client.get("/v1/batches", params={"limit": 101}).status_code == 400
