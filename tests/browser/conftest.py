"""Browser fixtures: Debian's chromium through Playwright, against the live batchyard server.

The server is tests/conftest.py's `live_server`: a real `batchyard serve` process on the
real default model. Tests drive the dashboard the way a person would (drop, click, wait).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.conftest import OUTPUT, LiveServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test command installs chromium; if it is missing anyway, say so plainly."""
    if Path(CHROMIUM).exists():
        return
    mark = pytest.mark.skip(reason=f"{CHROMIUM} is missing: apt-get install -y chromium")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(mark)


@pytest.fixture(scope="session")
def base(live_server: LiveServer) -> str:
    """The base URL of the session's live server (tests/conftest.py starts it)."""
    return live_server.url


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
    shots = OUTPUT / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, **kwargs)
    return path
