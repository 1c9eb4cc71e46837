"""Two nodes on PostgreSQL and one SeaweedFS bucket, each with its own data dir (no shared
directory): upload on A, batch made on B, A killed with SIGKILL mid-batch, no line lost.

The kill and the checks are those of test_node_killed_mid_batch.py; what differs is that
the files live only in the bucket, so B reads the input A took and writes the output itself.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import create_engine

from harness.seaweed import Seaweed
from tests.e2e.test_node_killed_mid_batch import (
    NODE_ARGS,
    START_TIMEOUT,
    by_node,
    kill_while_it_holds_lines,
    upload_counting_lines,
)
from tests.factories import jsonl_lines
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, start_server, stop_server

pytestmark = pytest.mark.slow

LINES = 24


def test_two_nodes_share_only_the_database_and_the_bucket(
    tmp_path: Path, postgres_url: str, seaweed: Seaweed
) -> None:
    files = ["--files-url", f"s3://{seaweed.bucket}/two-nodes", "--s3-endpoint", seaweed.endpoint]
    common = ["--database-url", postgres_url, *NODE_ARGS, *files]
    a = start_server(
        tmp_path / "a",
        OUTPUT / "bucket-node-a.log",
        env=seaweed.env(),
        args=[*common, "--node-name", "nodeA"],
        timeout=START_TIMEOUT,
    )
    b = start_server(
        tmp_path / "b",
        OUTPUT / "bucket-node-b.log",
        env=seaweed.env(),
        args=[*common, "--node-name", "nodeB"],
        timeout=START_TIMEOUT,
    )
    db = create_engine(postgres_url)
    try:
        a_id = httpx.get(a.url + "/health", timeout=60).json()["node"]
        b_id = httpx.get(b.url + "/health", timeout=60).json()["node"]
        sdk_a = openai.OpenAI(base_url=a.api, api_key="unused", max_retries=0)
        sdk_b = openai.OpenAI(base_url=b.api, api_key="unused", max_retries=0)
        f, custom_ids = upload_counting_lines(sdk_a, LINES)
        created = sdk_b.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        at_kill = kill_while_it_holds_lines(a.process, a_id, db, created.id)
        held = [r for r in at_kill if r["claimed_by"] == a_id and r["status"] == "running"]

        finished = wait_for_status(sdk_b.batches.retrieve, created.id, timeout=300, poll=0.5)
        assert finished.status == "completed", finished
        out = jsonl_lines(sdk_b.files.content(finished.output_file_id or "").text)
        counts = finished.request_counts
        assert counts is not None
        ids = Counter(o["custom_id"] for o in out)
        assert sorted(ids) == sorted(custom_ids)
        assert max(ids.values()) == 1
        assert (counts.total, counts.completed, counts.failed) == (LINES, LINES, 0)
        assert finished.error_file_id is None
        final = {r["custom_id"]: r for r in by_node(db, created.id)}
        assert len(held) >= 1 and all(final[r["custom_id"]]["claimed_by"] == b_id for r in held)
        assert [p for n in ("a", "b") for p in (tmp_path / n / "files").iterdir()] == []
        done = Counter(r["claimed_by"] for r in final.values())
        print(
            f"\ntwo nodes on a bucket: {LINES} lines; A did {done[a_id]} and held {len(held)} "
            f"at the kill, B did {done[b_id]}; duplicates 0; counts total={counts.total} "
            f"completed={counts.completed} failed={counts.failed}"
        )
    finally:
        db.dispose()
        stop_server(b)
        if a.process.poll() is None:
            stop_server(a)
