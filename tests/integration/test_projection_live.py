"""A running batch's projected finish and deadline, through the real app: on the batch
list, the batch page and /metrics while it runs, and its projection error once it completes;
on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
import time

import pytest
from litestar.testing import TestClient

from tests.factories import batch_line, jsonl
from tests.fakes import FakeEngine
from tests.http_helpers import MakeClient
from tests.metrics import parse
from tests.waiting import until

pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)

LINES = 240


def start(client: TestClient, window: str = "1h") -> dict[str, object]:
    data = jsonl(*(batch_line(f"p{i}", f"q {i}") for i in range(LINES)))
    f = client.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    body = {"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions"}
    r = client.post("/v1/batches", json={**body, "completion_window": window})
    assert r.status_code == 200, r.text
    return dict(r.json())


def samples(client: TestClient, name: str) -> dict[str, float]:
    """{batch id: value} of a /metrics family labelled by batch."""
    found = parse(client.get("/metrics").text)[1]
    return {labels["batch"]: v for n, labels, v in found if n == name}


def test_a_running_batch_shows_when_it_will_finish_and_its_deadline(
    make_client: MakeClient,
) -> None:
    # About 80 lines a second (4 in flight, 50 ms each): the batch runs about 3 s.
    client = make_client(FakeEngine(delay=0.05, n_slots=2))
    b = start(client)
    bid = str(b["id"])
    finish = until(
        lambda: samples(client, "batchyard_batch_projected_finish_seconds").get(bid),
        30,
        "a projected finish in /metrics",
    )
    deadline = samples(client, "batchyard_batch_deadline_seconds")[bid]
    assert deadline == b["expires_at"] == int(str(b["created_at"])) + 3600
    now = time.time()
    assert now - 1 <= finish <= now + 30  # 240 lines at tens a second

    home = client.get("/").text
    row = re.search(rf'<li class="batch-row" id="row-{bid}".*?</li>', home, re.S)
    assert row, home
    assert f'id="finish-{bid}"' in row.group(0) and "finishes" in row.group(0)
    assert f'id="deadline-{bid}"' in row.group(0) and "deadline" in row.group(0)
    assert "in 1 h" in row.group(0)  # the 1h window's end

    page = client.get(f"/batches/{bid}").text
    if 'id="batch-finish"' in page:  # still running when the page was read
        assert "Projected to finish" in page and 'id="batch-deadline"' in page

    until(
        lambda: client.get(f"/v1/batches/{bid}").json()["status"],
        60,
        "the batch to complete",
        accept=lambda s: s == "completed",
    )
    errors = until(
        lambda: samples(client, "batchyard_batch_projection_error_seconds"),
        10,
        "the projection error in /metrics",
        accept=lambda e: bid in e,
    )
    assert abs(errors[bid]) < 30  # seconds off, on a batch of a few seconds
    assert bid not in samples(client, "batchyard_batch_projected_finish_seconds")
