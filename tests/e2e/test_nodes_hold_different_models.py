"""Two real nodes on one PostgreSQL, each holding a model the other lacks.

Node A (`batchyard serve`) has a copy of SmolLM2 named `smol-a` in its --models-dir; node B
(`batchyard serve` too, so that its id is on /health) has Gemma 3 270M as `gemma3-270m` in
its own. Neither reads the home stores (--no-discover), both refuse unknown names
(--strict-models). Each node publishes its names in the database (app/batches/nodes.py);
a batch for each model, both made on A, completes with every line claimed by the node that
holds its model (Request.claimed_by) and every answer's `model` that model's id, and a batch
naming a model no node has fails at validation, line by line. When the only node holding a
model is killed, its lines wait for it: never answered by another node's model.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.metrics import scrape, value
from tests.models import gemma, smollm2
from tests.waiting import until

pytestmark = pytest.mark.slow

LINES = 3
START_TIMEOUT = 180
#: A dead node's lines come back after this many seconds: short, so that the killed holder's
#: test waits past it in seconds.
LEASE_SECONDS = 3
NODE_ARGS = ["--parallel", "2", "--threads", "1", "--lease-seconds", str(LEASE_SECONDS)]
NODE_ARGS += ["--no-discover", "--strict-models"]


def test_each_nodes_model_runs_on_that_node(tmp_path: Path, postgres_url: str) -> None:
    data = tmp_path / "shared"  # the files location both nodes mount
    dir_a, dir_b = tmp_path / "models-a", tmp_path / "models-b"
    dir_a.mkdir()
    dir_b.mkdir()
    # A copy, not a link: the catalog keys a loaded model by its resolved file, and this one
    # must be a model of its own, not the embedded default under another name.
    shutil.copyfile(smollm2(), dir_a / "smol-a.gguf")
    (dir_b / "gemma3-270m.gguf").symlink_to(gemma())
    common = ["--database-url", postgres_url, *NODE_ARGS]
    a = start_server(
        data,
        OUTPUT / "models-node-a.log",
        args=[*common, "--node-name", "nodeA", "--models-dir", str(dir_a)],
        timeout=START_TIMEOUT,
    )
    b = None
    db = create_engine(postgres_url)
    try:
        b = start_server(
            data,
            OUTPUT / "models-node-b.log",
            args=[*common, "--node-name", "nodeB", "--models-dir", str(dir_b)],
            timeout=START_TIMEOUT,
        )
        a_id = httpx.get(a.url + "/health", timeout=60).json()["node"]
        b_id = httpx.get(b.url + "/health", timeout=60).json()["node"]

        def published() -> dict[str, set[str]]:
            with db.connect() as conn:
                rows = conn.execute(text("SELECT node_id, name FROM nodemodel")).all()
            names: dict[str, set[str]] = {}
            for node_id, name in rows:
                names.setdefault(node_id, set()).add(name)
            return names

        # Both nodes' names are in before a line is made: until then a node knows no model
        # of the other's (--strict-models).
        names = until(
            published, 60, "both nodes' model names", accept=lambda n: {a_id, b_id} <= set(n)
        )
        assert "smol-a" in names[a_id] and "smol-a" not in names[b_id]
        assert "gemma3-270m" in names[b_id] and "gemma3-270m" not in names[a_id]

        sdk = openai.OpenAI(base_url=a.api, api_key="unused", max_retries=0)
        batches = {}
        for model in ("smol-a", "gemma3-270m", "no-such-model"):
            lines = [
                batch_line(f"{model}-{i}", f"Say {i}.", model=model, max_tokens=2, temperature=0)
                for i in range(LINES)
            ]
            f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
            batches[model] = sdk.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            ).id

        unknown = wait_for_status(sdk.batches.retrieve, batches["no-such-model"], timeout=60)
        assert unknown.status == "failed" and unknown.errors and unknown.errors.data
        assert [(e.code, e.line) for e in unknown.errors.data] == [
            ("model_not_found", n) for n in range(1, LINES + 1)
        ]

        for model, holder in (("smol-a", a_id), ("gemma3-270m", b_id)):
            done = wait_for_status(sdk.batches.retrieve, batches[model], timeout=240, poll=0.5)
            assert done.status == "completed", done
            assert done.request_counts and done.request_counts.completed == LINES, done
            out = jsonl_lines(sdk.files.content(done.output_file_id or "").text)
            assert sorted(o["custom_id"] for o in out) == [f"{model}-{i}" for i in range(LINES)]
            assert {o["response"]["body"]["model"] for o in out} == {model}
            with db.connect() as conn:
                claimed = Counter(
                    conn.execute(
                        text("SELECT claimed_by FROM request WHERE batch_id = :b"),
                        {"b": batches[model]},
                    ).scalars()
                )
            assert claimed == {holder: LINES}, (model, claimed)
    finally:
        db.dispose()
        stop_server(a)
        if b is not None:
            stop_server(b)
    # A clean stop withdraws a node's names at once.
    db = create_engine(postgres_url)
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM nodemodel")).scalar() == 0
    db.dispose()


KILLED_LINES = 16


def test_the_only_node_holding_a_model_killed_its_lines_wait_for_it(
    tmp_path: Path, postgres_url: str
) -> None:
    """Gemma's lines, named in other letter case, run on node B; B is killed with SIGKILL
    mid-batch. Past B's lease, A (SmolLM2 only) answers none of them: they wait, shown on
    the batch page and in /metrics, until B comes back and finishes them, every answer
    gemma's."""
    data = tmp_path / "shared"
    dir_a, dir_b = tmp_path / "models-a", tmp_path / "models-b"
    dir_a.mkdir()
    dir_b.mkdir()
    shutil.copyfile(smollm2(), dir_a / "smol-a.gguf")
    (dir_b / "gemma3-270m.gguf").symlink_to(gemma())
    common = ["--database-url", postgres_url, *NODE_ARGS]
    b_args = [*common, "--node-name", "nodeB", "--models-dir", str(dir_b)]
    a = start_server(
        data,
        OUTPUT / "holder-killed-a.log",
        args=[*common, "--node-name", "nodeA", "--models-dir", str(dir_a)],
        timeout=START_TIMEOUT,
    )
    b = b2 = None
    db = create_engine(postgres_url)
    try:
        b = start_server(data, OUTPUT / "holder-killed-b.log", args=b_args, timeout=START_TIMEOUT)
        a_id = httpx.get(a.url + "/health", timeout=60).json()["node"]

        def b_published() -> bool:
            with db.connect() as conn:
                return bool(
                    conn.execute(
                        text("SELECT count(*) FROM nodemodel WHERE model_id = 'gemma3-270m'")
                    ).scalar()
                )

        until(b_published, 60, "node B's names")
        sdk = openai.OpenAI(base_url=a.api, api_key="unused", max_retries=0)
        lines = [
            # 8 tokens: each line still takes a few decode steps of the one thread, so B is
            # killed with most of them left.
            batch_line(f"g-{i}", f"Count to {i}.", model="GEMMA3-270M", max_tokens=8)
            for i in range(KILLED_LINES)
        ]
        f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
        batch_id = sdk.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id

        def claimed() -> Counter[str]:
            with db.connect() as conn:
                return Counter(
                    conn.execute(
                        text(
                            "SELECT claimed_by FROM request WHERE batch_id = :b"
                            " AND claimed_by IS NOT NULL"
                        ),
                        {"b": batch_id},
                    ).scalars()
                )

        def done() -> int:
            counts = sdk.batches.retrieve(batch_id).request_counts
            return counts.completed + counts.failed if counts else 0

        until(lambda: done() >= 2, 240, "two of gemma's lines done on B")
        b.process.send_signal(signal.SIGKILL)
        b.process.wait(10)
        at_kill = done()
        assert at_kill < KILLED_LINES
        # Past B's lease by 4 s, many of A's claims: not one line is A's.
        time.sleep(LEASE_SECONDS + 4)
        assert a_id not in claimed()
        assert done() == at_kill
        left = KILLED_LINES - at_kill
        page = httpx.get(f"{a.url}/batches/{batch_id}", timeout=30).text
        assert 'id="batch-unserved"' in page and "gemma3-270m" in page
        waiting = value(scrape(a.url), "batchyard_unserved_model_lines", model="gemma3-270m")
        assert 0 < waiting <= left

        # B comes back and finishes them.
        b2 = start_server(data, OUTPUT / "holder-back-b.log", args=b_args, timeout=START_TIMEOUT)
        final = wait_for_status(sdk.batches.retrieve, batch_id, timeout=300, poll=0.5)
        assert final.status == "completed", final
        assert final.request_counts and final.request_counts.completed == KILLED_LINES
        out = jsonl_lines(sdk.files.content(final.output_file_id or "").text)
        assert sorted(o["custom_id"] for o in out) == sorted(f"g-{i}" for i in range(KILLED_LINES))
        assert {o["response"]["body"]["model"] for o in out} == {"gemma3-270m"}
        assert a_id not in claimed()
    finally:
        db.dispose()
        stop_server(a)
        for node in (b, b2):
            if node is not None:
                stop_server(node)
