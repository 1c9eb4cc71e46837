"""Every field the openai SDK models is present, with a type its models accept."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient
from openai.pagination import SyncCursorPage
from openai.types import Batch, FileDeleted, FileObject

from tests.factories import batch_line, jsonl
from tests.http_helpers import batch_getter, create_batch, upload, wait_for_status

# One code path, two databases: each test runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)


def test_wire_shapes_match_the_sdk_types(client: TestClient) -> None:
    f = upload(client, jsonl(batch_line("a", "hi")))
    assert set(FileObject.model_fields) <= set(f)
    FileObject.model_validate(f, strict=False)
    b = create_batch(client, f["id"])
    b = wait_for_status(batch_getter(client), b["id"], ("completed",))
    assert set(Batch.model_fields) <= set(b)
    parsed = Batch.model_validate(b)
    assert parsed.request_counts is not None and parsed.request_counts.total == 1
    assert (
        parsed.usage is not None
        and parsed.usage.total_tokens == parsed.usage.input_tokens + parsed.usage.output_tokens
    )
    listing = client.get("/v1/batches").json()
    assert {"object", "data", "first_id", "last_id", "has_more"} <= set(listing)
    SyncCursorPage[Batch].model_validate(listing)
    d = client.delete(f"/v1/files/{b['output_file_id']}").json()
    FileDeleted.model_validate(d)
    assert d["deleted"] is True
