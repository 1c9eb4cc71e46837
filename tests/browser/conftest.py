"""Browser fixtures: Debian's chromium through Playwright, against a live batchyard server.

The server is a real `python -m app.cli serve` process on a free port with the real default
model; tests drive the dashboard the way a person would (drop a file, click, wait).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output" / "screenshots"

if not Path(CHROMIUM).exists():  # the test command installs it; say so plainly if it did not
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url}/health did not answer 200 within {timeout} s")


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server on the real default model (replaced by tests/conftest.py's once it exists)."""
    port = _free_port()
    data = tmp_path_factory.mktemp("browser-data")
    log = open(data / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--no-browser", "--port", str(port)]
        + ["--data-dir", str(data), "--parallel", "4"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def new_context(browser: Browser, scheme: str = "light", width: int = 1280) -> BrowserContext:
    return browser.new_context(
        color_scheme=scheme,  # type: ignore[arg-type]
        viewport={"width": width, "height": 900},
        accept_downloads=True,
    )


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = new_context(browser)
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    ctx.close()


def chat_lines(n: int, *, max_tokens: int = 8, prefix: str = "req") -> str:
    lines = []
    for i in range(1, n + 1):
        lines.append(
            json.dumps(
                {
                    "custom_id": f"{prefix}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "SmolLM2-135M-Instruct",
                        "messages": [
                            {"role": "user", "content": f"Say a word about the number {i}."}
                        ],
                        "max_tokens": max_tokens,
                        "temperature": 0,
                    },
                }
            )
        )
    return "\n".join(lines) + "\n"


def drop_file(page: Page, name: str, text: str) -> None:
    """A real drop: a DataTransfer holding a File, dispatched as dragenter, dragover, drop."""
    page.evaluate(
        """([name, text]) => {
            const dt = new DataTransfer();
            dt.items.add(new File([text], name, {type: "application/jsonl"}));
            const target = document.querySelector("main");
            for (const type of ["dragenter", "dragover", "drop"]) {
                target.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
            }
        }""",
        [name, text],
    )


def shoot(page: Page, name: str, **kwargs: Any) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, **kwargs)
    return path
