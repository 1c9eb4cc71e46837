"""x-request-id on answers that never reach a handler (refusals) and on 500s, whose message
names the same id as the header and the log."""

from __future__ import annotations

from typing import Any

from tests.fakes import FakeEngine
from tests.http_helpers import MakeClient


class BrokenStats(FakeEngine):
    def stats(self) -> Any:
        raise RuntimeError("the engine's figures are gone")


def test_refusals_and_server_errors_carry_the_id(make_client: MakeClient) -> None:
    client = make_client(BrokenStats(), api_keys=["key-one-aaaa"])
    refused = client.get("/v1/files")
    assert refused.status_code == 401 and refused.headers["x-request-id"].startswith("req_")
    cross_site = client.post("/v1/files", headers={"origin": "https://evil.example"})
    assert cross_site.status_code == 403 and cross_site.headers["x-request-id"]
    broken = client.get("/metrics", headers={"Authorization": "Bearer key-one-aaaa"})
    assert broken.status_code == 500
    rid = broken.headers["x-request-id"]
    assert rid in broken.json()["error"]["message"]
    ids = {r.headers["x-request-id"] for r in (refused, cross_site, broken)}
    assert len(ids) == 3
