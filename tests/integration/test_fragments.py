"""The dashboard's htmx fragments through the real app: a refusal inside any fragment is one
inline error sentence (status 200, so htmx swaps it in); pages and downloads keep the JSON
errors; none of the dashboard is in the OpenAPI schema."""

from __future__ import annotations

from litestar.testing import TestClient

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
