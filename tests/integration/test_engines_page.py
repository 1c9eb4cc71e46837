"""The engines page over HTTP: its Nodes section names this node, the lines it runs now and
the batch they belong to, linked; on SQLite and on PostgreSQL."""

from __future__ import annotations

import re

import pytest

from tests.factories import batch_line, jsonl
from tests.fakes import HangingEngine
from tests.http_helpers import MakeClient, batch_getter, create_batch, upload, wait_for_status
from tests.waiting import until

pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)


def test_the_engines_page_shows_which_node_runs_what(make_client: MakeClient) -> None:
    client = make_client(HangingEngine())
    node = client.get("/health").json()["node"]
    page = client.get("/engines")
    assert page.status_code == 200
    assert "No node is running a batch line now." in page.text

    f = upload(client, jsonl(*(batch_line(f"h{i}", "HANG", max_tokens=4) for i in range(2))))
    b = create_batch(client, f["id"])
    wait_for_status(batch_getter(client), b["id"], ("in_progress",))

    def page_and_row() -> tuple[str, str]:
        page = client.get("/engines").text
        found = re.search(rf'<tr data-node="{node}">(.*?)</tr>', page, re.S)
        return page, found.group(1) if found else ""

    page, row = until(
        page_and_row,
        10,
        "this node's 2 running lines",
        accept=lambda p: '<td class="num">2</td>' in p[1],
    )
    assert '<h3 id="nodes-title">Nodes</h3>' in page
    assert "this node" in row
    assert '<td class="num">2</td>' in row, row
    assert f'<a href="/batches/{b["id"]}">' in row
    client.post(f"/v1/batches/{b['id']}/cancel")
    wait_for_status(batch_getter(client), b["id"], ("cancelled",))


def test_the_engines_page_shows_the_lines_waiting(make_client: MakeClient) -> None:
    client = make_client(HangingEngine(n_slots=1))  # room for 2 lines: the rest wait
    f = upload(client, jsonl(*(batch_line(f"w{i}", "HANG", max_tokens=4) for i in range(5))))
    b = create_batch(client, f["id"])
    wait_for_status(batch_getter(client), b["id"], ("in_progress",))

    def engine_row() -> str:
        page = client.get("/engines").text
        found = re.search(r'<tr data-engine="embedded">(.*?)</tr>', page, re.S)
        return found.group(1) if found else ""

    row = until(engine_row, 10, "3 lines waiting", accept=lambda r: 'data-col="waiting">3<' in r)
    assert re.search(r'data-col="oldest">\d+ s<', row), row
    client.post(f"/v1/batches/{b['id']}/cancel")
    wait_for_status(batch_getter(client), b["id"], ("cancelled",))
