"""Shared fixtures: one live `batchyard serve` process on the real default model per session."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"


def chat_line(cid: str, content: str, max_tokens: int = 16, **extra: object) -> dict[str, Any]:
    """One batch input line for /v1/chat/completions, greedy, as an OpenAI script writes it."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **extra,
        },
    }


def jsonl_bytes(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def start_server(
    data_dir: Path,
    log_path: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    timeout: float = 120,
) -> LiveServer:
    """Start `batchyard serve` as a real process and wait for /health to say ready."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
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
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(f"http://127.0.0.1:{port}", data_dir, proc, log_path)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"batchyard serve exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"batchyard serve was not ready in {timeout}s:\n{server.log()}")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
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


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("live-data")
    server = start_server(data, OUTPUT / "live-server.log")
    yield server
    stop_server(server)
