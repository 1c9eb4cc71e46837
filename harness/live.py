"""`batchyard serve` from a checkout as a real process on a free port, for tests and benches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.waiting import until

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"
#: `batchyard` as this Python runs it from a checkout (PYTHONPATH: checkout_env).
CLI = [sys.executable, "-m", "app.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkout_env(extra: dict[str, str] | None = None, root: Path = ROOT) -> dict[str, str]:
    """This environment, with Python pointed at the checkout (so the worktree's code runs)."""
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1", **(extra or {})}


@dataclass
class LiveServer:
    url: str  # base URL, e.g. http://127.0.0.1:PORT
    data_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def api(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def http(self, timeout: float = 30) -> httpx.Client:
        """An HTTP client on the server's root, for the helpers in tests/http_helpers.py."""
        return httpx.Client(base_url=self.url, timeout=timeout)


def start_server(
    data_dir: Path,
    log_path: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    timeout: float = 120,
    root: Path = ROOT,
) -> LiveServer:
    """Start `batchyard serve` as a real process and wait for /health to say ready.

    `args` come after the defaults here (4 slots of 1024 tokens), so they win over them.
    `root` is the checkout it runs from (a bench may run an older one beside this one).
    """
    port = port or free_port()
    cmd = [
        *CLI,
        "serve",
        "--no-browser",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--parallel",
        "4",
        "--ctx-size",
        "1024",
        *(args or []),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            cmd, cwd=root, env=checkout_env(env, root), stdout=log, stderr=subprocess.STDOUT
        )
    server = LiveServer(f"http://127.0.0.1:{port}", data_dir, proc, log_path)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"batchyard serve exited with {proc.returncode}:\n{server.log()}")
        return httpx.get(server.url + "/health", timeout=2).status_code == 200

    try:
        until(ready, timeout, "batchyard serve's /health", poll=0.1, ignoring=(httpx.HTTPError,))
    except AssertionError as e:
        proc.kill()
        raise RuntimeError(f"{e}\n{server.log()}") from None
    return server


def stop_process(process: subprocess.Popen[Any], timeout: float = 15) -> None:
    """Ask a server process to stop (SIGTERM), and kill it if it has not within `timeout`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_server(server: LiveServer) -> None:
    stop_process(server.process)
