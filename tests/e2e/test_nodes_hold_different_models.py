"""Two real nodes on one PostgreSQL, each holding a model the other lacks.

Node A (`batchyard serve`) has a copy of SmolLM2 named `smol-a` in its --models-dir; node B
(`batchyard serve` too, so that its id is on /health) has Gemma 3 270M as `gemma3-270m` in
its own. Neither reads the home stores (--no-discover), both refuse unknown names
(--strict-models). Each node publishes its names in the database (app/batches/nodes.py);
a batch for each model, both made on A, completes with every line claimed by the node that
holds its model (Request.claimed_by) and every answer's `model` that model's id, and a batch
naming a model no node has fails at validation, line by line.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from app.batches.nodes import ELSEWHERE_LOOK
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.models import gemma, smollm2
from tests.waiting import until

pytestmark = pytest.mark.slow

LINES = 3
START_TIMEOUT = 180
NODE_ARGS = ["--parallel", "2", "--threads", "1", "--lease-seconds", "6"]
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

        # Both nodes' names are in before a line is made: until then a node takes a name
        # only the other serves for an unknown one.
        names = until(
            published, 60, "both nodes' model names", accept=lambda n: {a_id, b_id} <= set(n)
        )
        assert "smol-a" in names[a_id] and "smol-a" not in names[b_id]
        assert "gemma3-270m" in names[b_id] and "gemma3-270m" not in names[a_id]
        # Validation reads the names at once; the claims read them once a look: let both
        # nodes' claims have read the other's.
        time.sleep(2 * ELSEWHERE_LOOK)

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
