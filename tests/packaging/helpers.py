"""Shared by the packaging tests: a clean copy of the checkout, and a server started from it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import ROOT, free_port, stop_process


def clean_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked and not ignored), without .venv or build output."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def static_files(source: Path) -> list[str]:
    """The checkout's static files, real ones first (not .keep placeholders)."""
    found = sorted(files_under(source / "static"), key=lambda s: (s.endswith(".keep"), s))
    assert found, "static/ is empty"
    return found


def outside_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


@dataclass
class Started:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    seconds_to_ready: float

    def stop(self) -> None:
        stop_process(self.process, timeout=20)


def start(cmd: list[str], cwd: Path, log: Path, timeout: float = 120, **env: str) -> Started:
    """Run `<cmd> serve ...` from `cwd` and wait for /health to say ready."""
    port = free_port()
    data = cwd / "batchyard-data"
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [*cmd, "serve", "--no-browser", "--port", str(port), "--data-dir", str(data),
             "--parallel", "2", "--ctx-size", "512"],
            cwd=cwd,
            env=outside_env(**env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = Started(f"http://127.0.0.1:{port}", proc, log, 0.0)
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            r = httpx.get(server.url + "/health", timeout=2)
            if r.status_code == 200 and r.json()["status"] == "ready":
                server.seconds_to_ready = time.monotonic() - t0
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > timeout:
            server.stop()
            raise AssertionError(f"not ready in {timeout}s:\n{log.read_text()}")
        time.sleep(0.1)


def check_dashboard(url: str, static_files: list[str]) -> None:
    """The dashboard page, and the static files it links to (or, failing that, one of them)."""
    page = httpx.get(url + "/")
    assert page.status_code == 200, page.text
    assert "text/html" in page.headers["content-type"]
    assert "<html" in page.text.lower()
    linked = re.findall(r"""(?:src|href)=["'](/static/[^"'?#]+)""", page.text)
    wanted = linked or [f"/static/{static_files[0]}"]
    for path in wanted:
        r = httpx.get(url + path)
        assert r.status_code == 200, path
    metrics = httpx.get(url + "/metrics")
    assert metrics.status_code == 200 and "batchyard_ready 1" in metrics.text
