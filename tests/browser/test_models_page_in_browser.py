"""The Models page in a real browser over a real pool: the default SmolLM2 and Gemma 3 270M
in a models dir; Load brings Gemma from "on disk" to loaded (its load counted, its measured
memory shown), Unload takes it back; "Run with" on the New batch card runs a file written
for another model on Gemma, and the batch's page says so. A vision model's folder (a model
header and its projector beside it, never loaded) shows the model takes images, and the
table fits a 1,280-pixel window: its last column and buttons inside the card."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.browser.pages import drop_file, shoot
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.metrics import scrape, value
from tests.models import GEMMA_FILE, gemma, header_model, header_projector

GEMMA = Path(GEMMA_FILE).stem
#: A folder as `hf download` or LM Studio leaves one: a model and its projector.
VISION = "Qwen2.5-VL-7B-Instruct-GGUF"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("models-page")
    models = root / "models"
    models.mkdir()
    (models / GEMMA_FILE).symlink_to(gemma())
    header_model(models / VISION / "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf", context_length=128000)
    header_projector(models / VISION / "mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf")
    server = start_server(
        root / "data",
        OUTPUT / "browser-models.log",
        args=["--models-dir", str(models), "--no-discover", "--ctx-size", "512"],
    )
    try:
        yield server
    finally:
        stop_server(server)


def test_load_and_unload_a_second_model_from_the_models_page(
    page: Page, two_models: LiveServer
) -> None:
    page.goto(two_models.url + "/models")
    expect(page).to_have_title("Models · batchyard")
    gemma_row = page.locator(f'tr[data-model="{GEMMA}"]')
    expect(gemma_row).to_contain_text("models-dir")
    expect(gemma_row).to_contain_text("Q4_K_M")
    expect(gemma_row.locator('[data-col="state"]')).to_have_text("on disk")
    expect(gemma_row.locator('[data-col="loads"]')).to_have_text("0")
    default_row = page.locator("table.models tbody tr").first
    expect(default_row).to_contain_text("default")

    gemma_row.get_by_role("button", name=f"Load {GEMMA}").click()
    expect(page.locator("#models-message")).to_contain_text(f"Loading {GEMMA}")
    state = gemma_row.locator('[data-col="state"]')
    expect(state).to_have_text("idle", timeout=60_000)
    expect(gemma_row.locator('[data-col="loads"]')).to_contain_text("1 ·")
    expect(gemma_row.locator('[data-col="memory"]')).to_contain_text("measured")
    expect(page.locator("#models-reserved")).not_to_have_text("0 B")
    shoot(page, "models-light")
    # The table refreshes every few seconds; a keyboard user's focus stays on its button.
    unload = gemma_row.get_by_role("button", name=f"Unload {GEMMA}")
    unload.focus()
    page.evaluate("window.__table = document.getElementById('models-table')")
    page.wait_for_function("document.getElementById('models-table') !== window.__table")
    expect(unload).to_be_focused()
    samples = scrape(two_models.url)  # /metrics says the same
    assert value(samples, "batchyard_model_loaded", model=GEMMA) == 1
    assert value(samples, "batchyard_model_loads_total", model=GEMMA) == 1
    assert value(samples, "batchyard_model_load_seconds", model=GEMMA) > 0
    reserved = value(samples, "batchyard_models_memory_bytes")
    assert 0 < reserved <= value(samples, "batchyard_models_memory_budget_bytes")

    gemma_row.get_by_role("button", name=f"Unload {GEMMA}").click()
    expect(page.locator("#models-message")).to_contain_text(f"Unloading {GEMMA}")
    expect(state).to_have_text("on disk", timeout=30_000)
    expect(gemma_row.get_by_role("button", name=f"Load {GEMMA}")).to_be_visible()
    assert value(scrape(two_models.url), "batchyard_model_loaded", model=GEMMA) == 0


def test_run_with_runs_a_file_on_the_model_chosen(page: Page, two_models: LiveServer) -> None:
    page.goto(two_models.url + "/")
    text = jsonl(*(batch_line(f"g{i}", "Hi", model="gpt-4o-mini", max_tokens=2) for i in range(2)))
    drop_file(page, "for-openai.jsonl", text.decode())
    expect(page.locator("#preview-lines")).to_have_text("2")
    page.select_option("#run-with", GEMMA)
    shoot(page, "run-with-light")
    page.click("#start-batch")
    link = page.locator(".notice a")
    expect(link).to_be_visible()
    link.click()
    expect(page.locator("#batch-status")).to_have_text("completed", timeout=120_000)
    said = page.locator("dd", has=page.locator("#batch-model"))
    expect(said).to_contain_text(GEMMA)
    # Gemma was unloaded by the test before: this batch waited for one load of it.
    expect(said).to_contain_text(re.compile(r"(idle|loaded) 1 load while it ran, \d+ since start"))
    shoot(page, "batch-model-light")

    batch_id = re.sub(r".*/batches/", "", page.url)
    with httpx.Client(base_url=two_models.api, timeout=30) as http:
        batch = http.get(f"/batches/{batch_id}").json()
        stored = http.get(f"/files/{batch['input_file_id']}").json()
        assert stored["filename"] == f"for-openai ({GEMMA}).jsonl"
        out = jsonl_lines(http.get(f"/files/{batch['output_file_id']}/content").text)
    answers = [line["response"]["body"]["model"] for line in out]
    assert answers == [GEMMA, GEMMA]


def test_the_table_fits_a_1280_pixel_window_and_says_which_models_take_images(
    page: Page, two_models: LiveServer
) -> None:
    assert page.viewport_size is not None and page.viewport_size["width"] == 1280
    page.goto(two_models.url + "/models")
    vision = page.locator(f'tr[data-model="{VISION}"]')
    expect(vision.locator('[data-col="images"]')).to_have_text("images")
    expect(vision.locator('[data-col="images"]')).to_have_attribute(
        "title", re.compile(r"projector is .*mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf$")
    )
    expect(vision.locator('[data-col="projector"]')).to_contain_text("projector")
    expect(page.locator(f'tr[data-model="{GEMMA}"] [data-col="images"]')).to_have_count(0)
    expect(page.locator("table.models button").first).to_be_visible()
    shoot(page, "models-1280")

    def box(selector: str) -> dict[str, float]:
        found = page.locator(selector).first.bounding_box()
        assert found is not None, selector
        return found

    def inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
        return (
            outer["x"] <= inner["x"] and inner["x"] + inner["width"] <= outer["x"] + outer["width"]
        )

    card, wrap = box("section.card"), box(".table-wrap")
    assert inside(wrap, card)
    header = page.locator("table.models thead th")
    cells = [header.nth(header.count() - 1), *page.locator("table.models tbody td.actions").all()]
    buttons = page.locator("table.models button").all()
    assert len(cells) == 1 + page.locator("table.models tbody tr").count() and buttons
    for item in cells + buttons:
        found = item.bounding_box()
        assert found is not None and inside(found, wrap), (item, found, wrap)
    # /v1/models says the same.
    cards = {m["id"]: m for m in httpx.get(two_models.api + "/models", timeout=10).json()["data"]}
    assert cards[VISION]["input_modalities"] == ["text", "image"]
    assert cards[VISION]["projector"] == "mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf"
    assert cards[VISION]["estimated_projector_bytes"] > 0
    assert cards[GEMMA]["input_modalities"] == ["text"] and cards[GEMMA]["projector"] is None
    # Nothing hidden to scroll to.
    assert (
        page.evaluate("(w => w.scrollWidth - w.clientWidth)(document.querySelector('.table-wrap'))")
        == 0
    )
