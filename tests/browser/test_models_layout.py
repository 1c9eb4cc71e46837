"""The Models page's table at its busiest, in chromium: long hub and Ollama ids, aliases, a
missing part's error, a model loading, one with requests in flight and a thousand lines
waiting, models that take images. The app is the real one over SQLite; the pool is the
stand-in of tests/pool_double.py, so every state shows at once. At 1,280 pixels the table
fits its card: no column is cut, every Load and Unload button lies inside it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient
from playwright.sync_api import Page, Route

from app.config import Settings
from app.server import create_app
from tests.browser.pages import shoot
from tests.pool_double import MiB, PoolDouble, entry, model_view

ORIGIN = "http://batchyard.test"


def busy_pool() -> PoolDouble:
    now = time.time()
    return PoolDouble(
        [
            model_view(
                entry("SmolLM2-135M-Instruct.Q4_1", is_default=True, source="default"),
                "loaded",
                in_flight=12,
                waiting=1234,
                loads=3,
                last_used=now - 720,
                measured_bytes=1211 * MiB,
                load_seconds=12.34,
            ),
            model_view(
                entry(
                    "hf.co/unsloth/Qwen2.5-VL-7B-Instruct-GGUF:Q4_K_M",
                    names=("qwen-vl",),
                    source="ollama",
                    size=4680 * MiB,
                    estimate=6100 * MiB,
                    projector=1290 * MiB,
                ),
                "loading",
                waiting=56,
            ),
            model_view(
                entry(
                    "lmstudio-community/gemma-3-4b-it-GGUF",
                    names=("lmstudio-community/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf",),
                    source="lmstudio",
                    size=2490 * MiB,
                    estimate=3900 * MiB,
                    projector=950 * MiB,
                ),
                "idle",
                loads=1,
                last_used=now - 30,
                measured_bytes=3650 * MiB,
                load_seconds=3.2,
            ),
            model_view(
                entry(
                    "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M",
                    source="hf",
                    size=4920 * MiB,
                    estimate=9800 * MiB,
                ),
                "on disk",
            ),
            model_view(
                entry(
                    "DeepSeek-R1-Distill-Qwen-14B-Q4_K_M",
                    error="missing part DeepSeek-R1-Distill-Qwen-14B-Q4_K_M-00003-of-00003.gguf",
                ),
                "on disk",
            ),
            model_view(
                entry("mistral-small-3.1-24b-instruct-2503-q4_k_m", size=14300 * MiB),
                "failed",
                loads=1,
            ),
        ],
        budget=20480 * MiB,
    )


@pytest.fixture
def app_page(page: Page, tmp_path: Path) -> Iterator[Page]:
    """`page` with every request to ORIGIN answered by the app (over a busy pool)."""
    settings = Settings(data_dir=str(tmp_path / "data"))
    with TestClient(create_app(settings, engine=busy_pool())) as client:

        def answer(route: Route) -> None:
            got = client.get(route.request.url.removeprefix(ORIGIN))
            route.fulfill(
                status=got.status_code,
                body=got.content,
                headers={"content-type": got.headers.get("content-type", "text/plain")},
            )

        page.route(ORIGIN + "/**", answer)
        yield page


def test_the_busiest_table_fits_a_1280_pixel_window(app_page: Page) -> None:
    page = app_page
    assert page.viewport_size is not None and page.viewport_size["width"] == 1280
    page.goto(ORIGIN + "/models")
    rows = page.locator("table.models tbody tr")
    assert rows.count() == 6
    shoot(page, "models-busy-1280")

    found = page.evaluate(
        """() => {
            const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.right]; };
            const wrap = document.querySelector('.table-wrap');
            return {
                card: box(document.querySelector('section.card')),
                wrap: box(wrap),
                hidden: wrap.scrollWidth - wrap.clientWidth,
                last: [...document.querySelectorAll('table.models tr')].map(r => box(r.lastElementChild)),
                buttons: [...document.querySelectorAll('table.models button')].map(box),
            };
        }"""
    )
    (card_left, card_right), (left, right) = found["card"], found["wrap"]
    assert card_left <= left and right <= card_right
    assert found["hidden"] == 0  # no column to scroll to
    assert len(found["last"]) == 7 and len(found["buttons"]) == 4  # 2 Unload, 2 Load
    for box_left, box_right in found["last"] + found["buttons"]:
        assert left <= box_left and box_right <= right, (found, box_left, box_right)
    # The two models with a projector say they take images.
    assert page.locator('table.models [data-col="images"]').count() == 2
