"""A file's content from the API and from the dashboard: one download, the same headers and
bytes (application/octet-stream, as OpenAI's API answers file content)."""

from __future__ import annotations

from litestar.testing import TestClient
from openai import OpenAI

from tests.factories import batch_line, jsonl
from tests.http_helpers import upload

SAME = ("content-type", "content-disposition", "content-length")


def test_the_api_and_the_dashboard_send_one_file_the_same_way(client: TestClient) -> None:
    data = jsonl(batch_line("a", "hello"), batch_line("b", "héllo"))
    file_id = upload(client, data, name="in.jsonl")["id"]
    api = client.get(f"/v1/files/{file_id}/content")
    page = client.get(f"/files/{file_id}/download")
    assert api.status_code == page.status_code == 200
    assert api.content == page.content == data
    assert api.headers["content-type"] == "application/octet-stream"
    assert api.headers["content-disposition"].startswith("attachment;")
    assert 'filename="in.jsonl"' in api.headers["content-disposition"]
    assert {h: api.headers[h] for h in SAME} == {h: page.headers[h] for h in SAME}
    sdk = OpenAI(api_key="unused", base_url=f"{client.base_url}/v1", http_client=client)
    assert sdk.files.content(file_id).content == data
    assert client.get("/files/file-nope/download").status_code == 404
