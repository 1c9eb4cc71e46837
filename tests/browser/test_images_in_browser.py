"""Images on the dashboard in a real browser, on a live `batchyard serve` whose --models-dir
holds the test vision pair (tests/vision.py) as `vision`: drop a zip of three photos, see
their thumbnails in the preview of the first requests, start the batch, wait for it, and see
each line's image beside its answer in the results explorer, in its row and opened."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.pages import drop_file, shoot
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.vision import MMPROJ_FILE, MODEL_FILE, png, vision_model  # noqa: F401

pytestmark = pytest.mark.slow

PHOTOS = {
    "a-red.png": (220, 30, 30),
    "b-blue.png": (20, 40, 220),
    "c-green.png": (30, 200, 40),
}
RUN_TIMEOUT = 180_000


@pytest.fixture(scope="module")
def vision_server(
    tmp_path_factory: pytest.TempPathFactory,
    vision_model: Path,  # noqa: F811
) -> Iterator[LiveServer]:
    models = tmp_path_factory.mktemp("browser-vision-models")
    (models / "vision").mkdir()
    for name in (MODEL_FILE, MMPROJ_FILE):
        (models / "vision" / name).symlink_to(vision_model / name)
    args = ["--threads", "2", "--no-discover", "--models-dir", str(models)]
    server = start_server(
        tmp_path_factory.mktemp("browser-vision-data"),
        OUTPUT / "browser-images.log",
        args=args,
        timeout=180,
    )
    yield server
    stop_server(server)


def photos_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, colour in PHOTOS.items():
            z.writestr(name, png(colour, size=(320, 240), stripes=6 if "red" in name else 0))
    return buf.getvalue()


def expect_loaded(images: Locator, count: int) -> None:
    """`count` images, each shown: decoded by the browser, not a broken icon."""
    expect(images).to_have_count(count)
    for i in range(count):
        expect(images.nth(i)).to_be_visible()
        images.nth(i).evaluate("img => img.decode()")  # fails for an image that cannot load
        assert images.nth(i).evaluate("img => img.naturalWidth") == 160


def test_drop_a_zip_of_photos_and_see_them_beside_their_answers(
    page: Page, vision_server: LiveServer
) -> None:
    base = vision_server.url.rstrip("/")
    page.goto(base + "/")
    drop_file(page, "photos.zip", photos_zip(), type="application/zip")

    columns = page.locator("#sheet-columns")
    expect(columns.locator("thead")).to_contain_text("image")
    expect(columns.locator("tbody tr")).to_have_count(3)
    expect(columns.locator("tbody")).to_contain_text("a-red.png")
    expect(page.locator("#sheet-template")).to_have_value("{{ image(image) }}")
    expect(page.locator("#sheet-model")).to_have_value("vision")  # the model that sees
    page.fill("#sheet-template", "Describe {{ name }} in a few words. {{ image(image) }}")
    page.fill("#sheet-max-tokens", "8")

    preview = page.locator("#sheet-preview")
    expect(preview).to_contain_text("Describe a-red.png in a few words.")
    expect(page.locator("#sheet-estimate")).to_contain_text("3 rows")
    expect_loaded(preview.locator("img.thumb"), 3)
    shoot(page, "images-sheet-form")

    page.click("#sheet-start")
    link = page.locator(".notice a")
    expect(link).to_be_visible()
    batch_id = link.inner_text().strip()
    page.goto(f"{base}/batches/{batch_id}")
    expect(page.locator("#batch-status")).to_have_text("completed", timeout=RUN_TIMEOUT)
    page.reload()  # the explorer as a person opening the finished batch sees it

    rows = page.locator("#explorer-lines tr.line-row")
    expect(rows).to_have_count(3)
    expect(page.locator("#explorer-lines thead")).to_contain_text("Images")
    expect_loaded(page.locator("#explorer-lines td.images img.thumb"), 3)
    for i in range(3):
        row = rows.nth(i)
        expect(row.locator(".badge")).to_have_text("200")
        expect(row.locator("td.preview")).not_to_be_empty()
        # The image sits beside the answer: same row, left of it, vertically overlapping.
        thumb = row.locator("td.images img.thumb").bounding_box()
        answer = row.locator("td.preview").bounding_box()
        assert thumb is not None and answer is not None
        assert thumb["x"] + thumb["width"] <= answer["x"]
        assert (
            thumb["y"] < answer["y"] + answer["height"]
            and answer["y"] < thumb["y"] + thumb["height"]
        )

    rows.nth(0).locator("a.line-open").click()
    detail = page.locator("#line-detail")
    expect(detail).to_contain_text("a-red.png")
    expect(detail.locator("#line-answer")).to_be_visible()
    expect_loaded(detail.locator("#line-images img.thumb"), 1)
    box = page.locator("main").bounding_box()
    assert box is not None and box["width"] <= 1280
    shoot(page, "images-explorer")
