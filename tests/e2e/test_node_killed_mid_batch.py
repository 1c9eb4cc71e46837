"""Several real nodes on one PostgreSQL database: kill -9 one mid-batch, lose no line.

Three processes on the real default model share one database and one files location:
node A and node B are `batchyard serve`, node C is `batchyard worker`. The batch is made
on A and read on B (any node answers any call); its lines spread over all three; B is
killed with SIGKILL after it has recorded lines and while it holds more. The others take
B's lines over when their leases lapse, and the batch completes with every custom_id
exactly once, its counts agreeing with its files. The database is read directly to count
who did what (Request.claimed_by).

It must hold on a loaded 2-core machine, so nothing here depends on how fast a step is:
start-ups get minutes; B is stopped (SIGSTOP) before the rows are read for the kill, so what
it held is what it held when killed, not a poll some hundred milliseconds old; the lease is
long enough that a live node starved of CPU still renews its own in time.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import FileObject
from sqlalchemy import Engine, create_engine, text

from tests.factories import batch_line, jsonl, jsonl_lines, jsonl_texts
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, start_batchyard, start_server, stop_process, stop_server
from tests.waiting import until

pytestmark = pytest.mark.slow

LINES = 40
#: Renewed every third of it: a live node would need a 4 s stall to lose a line it runs.
LEASE = "6"
#: Three model loads, one after another, on a machine other work may be loading too.
START_TIMEOUT = 300
#: Each node runs two lines at a time on one thread: three models share the machine's cores.
NODE_ARGS = ["--parallel", "2", "--threads", "1", "--lease-seconds", LEASE]


def by_node(db: Engine, batch_id: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        found = conn.execute(
            text("SELECT custom_id, status, claimed_by, attempts FROM request WHERE batch_id = :b"),
            {"b": batch_id},
        )
        return [dict(r._mapping) for r in found]


def kill_while_it_holds_lines(
    node: subprocess.Popen[Any], node_id: str, db: Engine, batch_id: str
) -> list[dict[str, Any]]:
    """SIGKILL `node` once it has recorded 2 lines of its own and holds more; the rows as it
    left them. It is stopped (SIGSTOP) while they are read, so it can neither record nor
    claim between the look and the kill; when they do not show what is wanted it goes on.
    (A loop that stops and resumes a process each turn, not a plain wait: no until().)"""
    deadline = time.time() + 240
    while True:
        rows = by_node(db, batch_id)
        if held_by(rows, node_id, "succeeded") >= 2 and held_by(rows, node_id, "running") >= 1:
            node.send_signal(signal.SIGSTOP)
            rows = by_node(db, batch_id)
            if held_by(rows, node_id, "succeeded") >= 2 and held_by(rows, node_id, "running"):
                node.send_signal(signal.SIGKILL)
                node.wait(30)
                return rows
            node.send_signal(signal.SIGCONT)
        # (no rows yet: the batch is still being validated)
        pending = sum(r["status"] == "pending" for r in rows)
        assert not rows or pending or held_by(rows, node_id, "running"), (
            f"the batch ran out before node B held lines: {rows}"
        )
        assert time.time() < deadline, (
            f"node B recorded too little: {Counter(r['claimed_by'] for r in rows)}"
        )
        time.sleep(0.05)


def upload_counting_lines(sdk: openai.OpenAI, n: int) -> tuple[FileObject, list[str]]:
    """An input file of n short counting lines (a few tokens each), uploaded through sdk,
    and the lines' custom_ids."""
    lines = [
        batch_line(f"line-{i}", f"Count to {i % 7 + 2}.", max_tokens=8, temperature=0)
        for i in range(n)
    ]
    f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    return f, [str(x["custom_id"]) for x in lines]


def held_by(rows: list[dict[str, Any]], node_id: str, status: str) -> int:
    return sum(r["claimed_by"] == node_id and r["status"] == status for r in rows)


def start_worker(
    data: Path, url: str, log_path: Path, timeout: float = START_TIMEOUT
) -> tuple[Any, str]:
    """`batchyard worker` as a real process; (process, node id) once it says it is ready."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115  (the child keeps its own copy)
    proc = start_batchyard(
        "worker", "--data-dir", str(data), "--database-url", url, "--node-name", "nodeC",
        *NODE_ARGS, "--ctx-size", "1024", stdout=log, stderr=log,
    )  # fmt: skip

    def node_id() -> str | None:
        text_so_far = log_path.read_text(errors="replace")
        for line in text_so_far.splitlines():
            if line.startswith("batchyard worker ") and " ready:" in line:
                return line.split()[2]
        assert proc.poll() is None, f"worker exited {proc.returncode}:\n{text_so_far}"
        return None

    try:
        return proc, until(node_id, timeout, "the worker's ready line", poll=0.1)
    except AssertionError as e:
        if proc.poll() is not None:
            raise  # it exited: the message has its log already
        proc.kill()
        raise AssertionError(f"{e}\n{log_path.read_text()}") from None


def test_kill_one_node_mid_batch_the_others_finish_every_line_once(
    tmp_path: Path, postgres_url: str
) -> None:
    data = tmp_path / "shared"  # the files location all nodes mount
    common = ["--database-url", postgres_url, *NODE_ARGS]
    a = start_server(
        data, OUTPUT / "node-a.log", args=[*common, "--node-name", "nodeA"], timeout=START_TIMEOUT
    )
    b = start_server(
        data, OUTPUT / "node-b.log", args=[*common, "--node-name", "nodeB"], timeout=START_TIMEOUT
    )
    worker, c_id = start_worker(data, postgres_url, OUTPUT / "node-c.log")
    db = create_engine(postgres_url)
    try:
        a_id = httpx.get(a.url + "/health", timeout=60).json()["node"]
        b_health = httpx.get(b.url + "/health", timeout=60).json()
        b_id = b_health["node"]
        assert a_id.startswith("nodeA-") and b_id.startswith("nodeB-") and c_id.startswith("nodeC-")
        assert b_health["database"] == "postgresql"

        sdk_a = openai.OpenAI(base_url=a.api, api_key="unused", max_retries=0)
        sdk_b = openai.OpenAI(base_url=b.api, api_key="unused", max_retries=0)
        f, custom_ids = upload_counting_lines(sdk_a, LINES)
        created = sdk_a.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert sdk_b.batches.retrieve(created.id).id == created.id  # any node answers

        # Kill B once it has recorded lines of its own and holds more.
        at_kill = kill_while_it_holds_lines(b.process, b_id, db, created.id)
        held = {
            r["custom_id"]: r["attempts"]
            for r in at_kill
            if r["claimed_by"] == b_id and r["status"] == "running"
        }
        done_before = Counter(r["claimed_by"] for r in at_kill if r["status"] == "succeeded")

        finished = wait_for_status(sdk_a.batches.retrieve, created.id, timeout=300, poll=0.5)
        assert finished.status == "completed", finished
        out = jsonl_lines(sdk_a.files.content(finished.output_file_id or "").text)
        errors = (
            jsonl_texts(sdk_a.files.content(finished.error_file_id).text)
            if finished.error_file_id
            else []
        )
        counts = finished.request_counts
        assert counts is not None
        ids = Counter(o["custom_id"] for o in out)
        duplicates = sum(n - 1 for n in ids.values())
        assert sorted(ids) == sorted(custom_ids) and duplicates == 0
        assert (counts.total, counts.completed, counts.failed) == (LINES, len(out), len(errors))
        assert all(o["response"]["status_code"] == 200 for o in out)

        final = by_node(db, created.id)
        done_after = Counter(r["claimed_by"] for r in final)
        retaken = [r for r in final if r["custom_id"] in held]
        # B's lines at the kill were run again by a live node, B's earlier results kept.
        # (Once more each, as a rule; more only if a starved live node's lease lapsed too.
        # A line B held may itself have been taken over from a lapsed lease: counted from
        # its attempts at the kill, not from 1.)
        assert len(retaken) == len(held) >= 1
        assert all(r["claimed_by"] in (a_id, c_id) for r in retaken)
        assert all(r["status"] == "succeeded" for r in retaken)
        assert all(r["attempts"] > held[r["custom_id"]] for r in retaken)
        assert done_after[b_id] == done_before[b_id] >= 2
        # Lines spread over every node.
        assert min(done_after[a_id], done_after[b_id], done_after[c_id]) >= 1, done_after
        print(
            f"\nkill-one-node: {LINES} lines; before the kill A={done_before[a_id]} "
            f"B={done_before[b_id]} C={done_before[c_id]} done, B held {len(held)}; "
            f"after: A={done_after[a_id]} B={done_after[b_id]} C={done_after[c_id]}; "
            f"retaken {len(retaken)}; duplicates: {duplicates}; "
            f"counts total={counts.total} completed={counts.completed} failed={counts.failed}"
        )
    finally:
        db.dispose()
        stop_process(worker)
        stop_server(a)
        if b.process.poll() is None:
            stop_server(b)
