"""Browser fixtures: Debian's chromium through Playwright, against the live batchyard server.

The server is tests/conftest.py's `live_server`: a real `batchyard serve` process on the
real default model. Tests drive the dashboard the way a person would (drop, click, wait).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.browser.pages import CHROMIUM, CHROMIUM_ARGS, new_context
from tests.live import LiveServer

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


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = new_context(browser)
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    ctx.close()
