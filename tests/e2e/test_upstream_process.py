"""Each upstream's HTTP client runs in a process of its own (app/engine/upstream/process.py).

A real front `batchyard serve --no-embedded --engine ...` in front of a real upstream
`batchyard serve`: the client process is killed in the middle of a batch, and the front
starts another and finishes every line once, none failed; a front killed with SIGKILL
leaves no client process behind.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.metrics import scrape, value
from tests.upstream_double import (
    UPSTREAM_MODEL,
    assert_every_line_once,
    counting_batch,
    upstream_model_args,
)
from tests.waiting import until

#: Two lines in flight when the client process is killed, ten waiting behind them.
LINES = 12
CHILD_MODULE = "app.engine.upstream.child"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("upstream-process")
    server = start_server(
        root / "upstream",
        OUTPUT / "upstream-process-upstream.log",
        args=[*upstream_model_args(root), "--parallel", "2"],
    )
    yield server
    stop_server(server)


def start_front(upstream: LiveServer, data: Path, name: str) -> LiveServer:
    return start_server(
        data,
        OUTPUT / f"upstream-process-{name}.log",
        args=[
            "--no-embedded",
            "--engine",
            f"up=openai:{upstream.api},models={UPSTREAM_MODEL},concurrency=2,retries=2",
        ],
    )


def client_processes(pid: int) -> list[int]:
    """The upstream client processes below process `pid`."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if CHILD_MODULE.encode() in cmdline:
                out.append(int(child))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_client_process_is_replaced_and_no_line_is_lost(
    upstream: LiveServer, tmp_path: Path
) -> None:
    front = start_front(upstream, tmp_path / "front", "front")
    try:
        (child,) = client_processes(front.process.pid)
        c = OpenAI(base_url=front.api, api_key="unused", max_retries=0, timeout=60)
        batch_id = counting_batch(c, LINES)
        os.kill(child, signal.SIGKILL)  # with 2 lines in flight at the upstream

        assert_every_line_once(c, batch_id, LINES)

        (again,) = client_processes(front.process.pid)
        assert again != child
        assert "lost its client process" in front.log()
        assert value(scrape(front.url), "batchyard_engine_up", engine="up") == 1
        # Online requests go through the new one too.
        answer = c.chat.completions.create(
            model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
    finally:
        stop_server(front)


def test_a_killed_node_leaves_no_client_process(upstream: LiveServer, tmp_path: Path) -> None:
    front = start_front(upstream, tmp_path / "front", "killed")
    try:
        (child,) = client_processes(front.process.pid)
        assert alive(child)
        front.process.send_signal(signal.SIGKILL)
        front.process.wait(10)
        until(lambda: alive(child), 10, "the client process to exit", accept=lambda a: not a)
    finally:
        stop_server(front)
