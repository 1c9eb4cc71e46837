"""Driving the dashboard in Debian's chromium: browser contexts, a real file drop, screenshots."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Page

from tests.live import OUTPUT

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def new_context(browser: Browser, scheme: str = "light", width: int = 1280) -> BrowserContext:
    return browser.new_context(
        color_scheme=scheme,  # type: ignore[arg-type]
        viewport={"width": width, "height": 900},
        accept_downloads=True,
    )


def drop_file(page: Page, name: str, data: str | bytes, type: str = "application/jsonl") -> None:
    """A real drop, as a person's: a DataTransfer holding a File of `data` (text is sent as
    UTF-8), dispatched as dragenter, dragover, drop."""
    raw = data.encode() if isinstance(data, str) else data
    page.evaluate(
        """([name, b64, type]) => {
            const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], name, {type}));
            const target = document.querySelector("main");
            for (const type of ["dragenter", "dragover", "drop"]) {
                target.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
            }
        }""",
        [name, base64.b64encode(raw).decode(), type],
    )


def htmx_idle(page: Page) -> None:
    """Wait until htmx has no request, swap or settle under way: what it swapped in is then
    processed, so an event on it (a change of a select, say) reaches its hx- attributes."""
    page.wait_for_function(
        "() => !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')"
    )


def shoot(page: Page, name: str, **kwargs: Any) -> Path:
    shots = OUTPUT / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, **kwargs)
    return path
