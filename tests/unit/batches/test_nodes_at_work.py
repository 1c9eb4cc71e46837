"""Which node runs what (the engines page's Nodes section), through the batches service on a
real SQLite file: this node's running lines and batches, another node's live claim counted
but its owner's batch not named, a lapsed claim and finished lines left out."""

from __future__ import annotations

import time
from pathlib import Path

from app.tables import BatchStatus, Request, RequestStatus
from tests.factories import batch_line
from tests.fakes import HangingEngine
from tests.unit.helpers import batch, make_batch, request_rows, services


def test_nodes_at_work_lists_this_node_its_running_lines_and_the_viewers_batches(
    tmp_path: Path,
) -> None:
    svc = services(tmp_path, HangingEngine())
    try:
        mine = make_batch(
            svc,
            [
                batch_line("a", "HANG a", max_tokens=4),
                batch_line("b", "HANG b", max_tokens=4),
                batch_line("c", "quick", max_tokens=4),
            ],
            owner="alice",
        )
        theirs = make_batch(svc, [batch_line("x", "HANG x", max_tokens=4)], owner="bob")
        assert svc.batches.nodes_at_work("alice") == []  # nothing claimed yet
        for _ in range(50):
            svc.runner.step()
        assert batch(svc, mine).status == BatchStatus.IN_PROGRESS

        me = svc.runner.worker_id
        [node] = svc.batches.nodes_at_work("alice")
        assert (node.node_id, node.running, node.batch_ids, node.this_node) == (
            me, 3, [mine], True,
        )  # fmt: skip
        # bob sees the same node and count, and only his own batch.
        [node] = svc.batches.nodes_at_work("bob")
        assert (node.running, node.batch_ids) == (3, [theirs])

        # Another node on the same database holds bob's line; a third node's lease lapsed.
        [x] = request_rows(svc, theirs)
        with svc.db.write() as s:
            row = s.get(Request, x.id)
            assert row is not None and row.status == RequestStatus.RUNNING
            row.claimed_by, row.lease_until = "nodeB-1a2b3c", time.time() + 60
            s.add(row)
        a = next(r for r in request_rows(svc, mine) if r.custom_id == "a")
        with svc.db.write() as s:
            row = s.get(Request, a.id)
            assert row is not None
            row.claimed_by, row.lease_until = "nodeC-dead00", time.time() - 1
            s.add(row)

        nodes = svc.batches.nodes_at_work("alice")
        assert [(n.node_id, n.running, n.batch_ids, n.this_node) for n in nodes] == [
            (me, 1, [mine], True),
            ("nodeB-1a2b3c", 1, [], False),
        ]
        assert [n.batch_ids for n in svc.batches.nodes_at_work("bob")] == [[], [theirs]]
    finally:
        svc.runner.stop()
