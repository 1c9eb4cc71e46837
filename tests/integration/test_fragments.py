"""The dashboard's htmx fragments through the real app: a refusal inside any fragment is one
inline error sentence (status 200, so htmx swaps it in); pages and downloads keep the JSON
errors; none of the dashboard is in the OpenAPI schema. The New batch card offers the
completion windows the server allows."""

from __future__ import annotations

import re

from litestar.testing import TestClient

from tests.factories import batch_line, jsonl
from tests.http_helpers import MakeClient

MISSING = "batch_nope"


def test_a_refused_fragment_renders_the_one_inline_error(client: TestClient) -> None:
    for method, path in [
        ("GET", f"/web/batches/{MISSING}/lines"),
        ("GET", f"/web/batches/{MISSING}/lines/3"),
        ("GET", f"/web/batches/{MISSING}/chart"),
        ("POST", f"/web/batches/{MISSING}/retry"),
        ("GET", f"/web/batches/{MISSING}/webhooks"),
        ("POST", "/web/webhooks/whd_nope/redeliver"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        assert r.headers["content-type"].startswith("text/html"), path
        assert r.text.startswith('<p class="alert" role="alert">') and "No " in r.text, path
    r = client.get(f"/batches/{MISSING}/finished/output")  # a download, not a fragment
    assert r.status_code == 404 and r.json()["error"]["param"] == "batch_id"


def test_the_dashboard_is_not_in_the_openapi_schema(client: TestClient) -> None:
    paths = client.get("/schema/openapi.json").json()["paths"]
    assert "/v1/files" in paths
    assert [p for p in paths if not p.startswith("/v1/")] == ["/health"]


def test_the_new_batch_card_offers_the_allowed_windows_and_starts_with_one(
    make_client: MakeClient,
) -> None:
    client = make_client(completion_windows="1h,90m")
    data = jsonl(batch_line("a", "hi"))
    r = client.post(
        "/web/upload",
        files={"file": ("in.jsonl", data, "application/jsonl")},
        data={"purpose": "batch"},
    )
    assert r.status_code == 200
    select = re.search(r'<select id="completion-window"[^>]*>(.*?)</select>', r.text)
    assert select, r.text
    options = re.findall(r'<option value="([^"]+)"( selected)?>', select.group(1))
    assert options == [("1h", ""), ("90m", ""), ("24h", " selected")]
    file_id = re.search(r'name="file_id" value="([^"]+)"', r.text)
    assert file_id
    form = {"file_id": file_id.group(1), "endpoint": "/v1/chat/completions"}
    started = client.post("/web/batches", data={**form, "completion_window": "90m"})
    assert started.status_code == 200
    (b,) = client.get("/v1/batches").json()["data"]
    assert b["completion_window"] == "90m" and b["expires_at"] == b["created_at"] + 5400
    refused = client.post("/web/batches", data={**form, "completion_window": "7d"})
    assert "Invalid completion_window &#34;7d&#34;. Supported: &#39;1h&#39;" in refused.text
