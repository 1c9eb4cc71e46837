"""Real processes for tests: the CLI's commands run from the checkout, and an app made in
this process served on a free port. `batchyard serve` itself is started by harness/live.py,
which the benches share; its names are re-exported here, so that a test imports its live
processes from one module."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

from harness.live import (
    CLI,
    OUTPUT,
    ROOT,
    LiveServer,
    checkout_env,
    free_port,
    start_server,
    stop_process,
    stop_server,
)
from harness.waiting import until

__all__ = [
    "CLI", "OUTPUT", "ROOT", "InProcessServer", "LiveServer", "batchyard", "checkout_env",
    "free_port", "serve_in_thread", "start_batchyard", "start_server", "stop_process",
    "stop_server",
]  # fmt: skip


def batchyard(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `batchyard ARGS` from the checkout to its end; its output captured as text."""
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env=checkout_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_batchyard(
    *args: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[str]:
    """Start `batchyard ARGS` from the checkout; stdout and stderr are pipes unless `popen`
    says otherwise."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen([*CLI, *args], cwd=ROOT, env=checkout_env(env), text=True, **streams)


@dataclass
class InProcessServer:
    """A real HTTP server on a free port, serving an app made in this process (so a test
    can hand it a FakeEngine): uvicorn in a thread."""

    url: str
    server: Any
    thread: Any

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def serve_in_thread(app: Any, timeout: float = 30) -> InProcessServer:
    import threading

    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("the in-process server's thread ended before it started")
        return bool(server.started)

    try:
        until(started, timeout, "the in-process server to start")
    except AssertionError:
        server.should_exit = True
        raise
    return InProcessServer(f"http://127.0.0.1:{port}", server, thread)
