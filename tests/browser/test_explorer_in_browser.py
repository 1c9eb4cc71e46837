"""The batch page's results explorer, throughput chart and retry button in a real browser,
on a 5,000-line batch: a server made for this module runs the batch on the FakeEngine (the
explorer's subject is paging and search over many rows, not decoding them)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from app.config import Settings
from app.server import create_app
from tests.browser.pages import new_context, shoot
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.fakes import FakeEngine
from tests.http_helpers import batch_getter, create_batch, upload, wait_for_status
from tests.live import OUTPUT, InProcessServer, serve_in_thread

N = 5000
#: Every 500th line asks the fake engine to fail.
FAILED = [f"req-{i}" for i in range(500, N + 1, 500)]
ONE_MB = 1024 * 1024


@pytest.fixture(scope="module")
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fake: FakeEngine) -> Iterator[InProcessServer]:
    data = tmp_path_factory.mktemp("explorer-data")
    app = create_app(Settings(data_dir=str(data), log_level="warning"), engine=fake)
    srv = serve_in_thread(app)
    yield srv
    srv.stop()


def run_batch(url: str, n: int, prefix: str = "req", *, wait: bool = True) -> str:
    lines = [
        batch_line(
            f"{prefix}-{i}",
            ("FAIL " if i % 500 == 0 else "") + f"Say a word about the number {i}.",
            max_tokens=1,
        )
        for i in range(1, n + 1)
    ]
    with httpx.Client(base_url=url, timeout=60) as c:
        f = upload(c, jsonl(*lines), name=f"{prefix}.jsonl")
        b = create_batch(c, f["id"], metadata={"purpose": "explorer test"})
        if wait:
            b = wait_for_status(batch_getter(c), b["id"], timeout=300)
            assert b["status"] == "completed", b
    return str(b["id"])


@pytest.fixture(scope="module")
def big(server: InProcessServer) -> str:
    return run_batch(server.url, N)


TIMED_SEARCH = """async ([q, line]) => {
    const input = document.querySelector("#explorer-q");
    const t0 = performance.now();
    input.value = q;
    input.dispatchEvent(new Event("input", {bubbles: true}));
    await new Promise((resolve, reject) => {
        const give_up = t0 + 10000;
        const look = () => {
            const first = document.querySelector("#explorer-lines tbody tr");
            if (first && first.dataset.line === String(line)) resolve();
            else if (performance.now() > give_up) reject(new Error(`no line ${line} for ${q}`));
            else setTimeout(look, 2);
        };
        look();
    });
    return performance.now() - t0;
}"""


def page_bytes(page: Page) -> int:
    """The bytes the page holds: its document and every response it fetched since."""
    return int(
        page.evaluate(
            """() => performance.getEntriesByType("navigation")
                .concat(performance.getEntriesByType("resource"))
                .reduce((n, e) => n + (e.decodedBodySize || 0), 0)"""
        )
    )


def test_search_filter_open_page_and_download_on_5000_lines(
    page: Page, browser: Browser, server: InProcessServer, big: str, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/batches/{big}")
    expect(page.locator("#count-all-lines")).to_have_text(str(N))
    expect(page.locator("#count-failed-lines")).to_have_text(str(len(FAILED)))
    rows = page.locator("#explorer-lines tbody tr")
    expect(rows).to_have_count(50)
    assert len(page.content()) < ONE_MB

    # Search as a user types; the time runs from the keystroke (with the 200 ms debounce)
    # to the row in the table, measured in the browser.
    timings = [page.evaluate(TIMED_SEARCH, [f"req-{n}", n]) for n in (4242, 17, 4999, 2500)]
    fetches = page.evaluate(
        """() => performance.getEntriesByType("resource")
            .filter((e) => e.name.includes("/lines?q=req-")).map((e) => e.duration)"""
    )
    print("search ms (typed, with the 200 ms debounce):", [round(t) for t in timings])
    print("search requests ms (the fetch alone):", [round(t) for t in fetches])
    (OUTPUT / "explorer-timings.json").write_text(
        json.dumps({"search_ms": timings, "fetch_ms": fetches, "page_bytes": page_bytes(page)})
    )
    assert max(timings) < 1000, timings
    expect(rows.first).to_contain_text("req-2500")
    expect(page.locator("#count-failed-lines")).to_have_text(str(len(FAILED)))

    # Failed lines only; open one: its input messages beside the error.
    page.fill("#explorer-q", "")
    page.locator("label.chip", has_text="Failed").click()
    expect(rows).to_have_count(len(FAILED))
    expect(rows.first).to_contain_text("req-500")
    rows.first.locator("a.line-open").click()
    detail = page.locator("#line-detail")
    expect(detail).to_contain_text("Line 500")
    expect(detail.locator(".input-side")).to_contain_text("FAIL Say a word about the number 500.")
    expect(detail.locator("#line-error")).to_contain_text("context_length_exceeded")
    shoot(page, "explorer-failed-line-light")

    # All lines again, page two; a succeeded line's answer beside its input.
    page.locator("label.chip", has_text="All").click()
    expect(rows.first).to_contain_text("req-1")
    page.click("#explorer-next")
    expect(rows.first).to_contain_text("req-51")
    expect(page.locator(".pager")).to_contain_text("lines 51–100")  # noqa: RUF001 - the pager's en dash
    rows.nth(1).locator("a.line-open").click()
    expect(detail.locator("#line-answer")).to_contain_text("echo: Say a word about the number 52.")
    expect(detail.locator(".input-side")).to_contain_text("user")
    shoot(page, "explorer-light")
    assert page_bytes(page) < ONE_MB, page_bytes(page)
    assert len(page.content()) < ONE_MB

    # Downloads: the errors so far are the error file's lines.
    with page.expect_download() as info:
        page.click("#download-finished-errors")
    saved = tmp_path / "errors.jsonl"
    info.value.save_as(saved)
    got = [x["custom_id"] for x in jsonl_lines(saved.read_text())]
    assert got == FAILED

    for scheme, width, suffix in (("dark", 1280, "dark"), ("light", 390, "phone")):
        ctx = new_context(browser, scheme, width)
        other = ctx.new_page()
        other.goto(f"{server.url}/batches/{big}?status=failed&line=1000")
        expect(other.locator("#line-detail")).to_contain_text("Line 1000")
        shoot(other, f"explorer-{suffix}")
        ctx.close()


def test_retry_button_makes_a_linked_batch(page: Page, server: InProcessServer) -> None:
    batch_id = run_batch(server.url, 1000, prefix="small")
    page.goto(f"{server.url}/batches/{batch_id}")
    page.once("dialog", lambda d: d.accept())
    page.click("#retry-batch")
    expect(page).not_to_have_url(re.compile(f"/batches/{batch_id}$"))
    expect(page.locator("#link-retry_of")).to_have_text(batch_id)
    new_id = page.url.rsplit("/", 1)[-1]
    expect(page.locator("#count-total")).to_have_text("2")
    expect(page.locator("#batch-status")).to_have_text("completed", timeout=60_000)
    expect(page.locator("#count-failed")).to_have_text("2")
    shoot(page, "retry-light")
    page.click("#link-retry_of")
    expect(page.locator("#link-retried_by")).to_have_text(new_id)


def test_chart_and_explorer_move_while_the_batch_runs(
    page: Page, browser: Browser, server: InProcessServer, fake: FakeEngine
) -> None:
    fake.delay = 0.25  # 4 slots: about 16 lines a second, so the batch runs for seconds
    try:
        batch_id = run_batch(server.url, 200, prefix="live", wait=False)
        page.goto(f"{server.url}/batches/{batch_id}")
        page.evaluate("window.__sameDocument = true")
        expect(page.locator("#batch-status")).to_have_text("in progress", timeout=30_000)
        page.locator("label.chip", has_text="Pending").click()
        summary = page.locator("#chart-summary")
        expect(summary).to_contain_text("ETA", timeout=30_000)
        first = summary.inner_text()
        expect(summary).not_to_have_text(first, timeout=30_000)
        pending = int(page.locator("#count-pending-lines").inner_text())
        assert 0 < pending < 200
        expect(page.locator("#throughput-chart .bars rect").first).to_be_attached()
        shoot(page, "chart-running-light")
        for scheme, width, suffix in (("dark", 1280, "dark"), ("light", 390, "phone")):
            ctx = new_context(browser, scheme, width)
            other = ctx.new_page()
            other.goto(f"{server.url}/batches/{batch_id}")
            expect(other.locator("#chart-summary")).to_contain_text("lines in")
            other.wait_for_timeout(1500)
            shoot(other, f"chart-running-{suffix}")
            ctx.close()
        expect(page.locator("#batch-status")).to_have_text("completed", timeout=60_000)
        # The explorer followed along without a reload: nothing is pending any more.
        expect(page.locator("#count-pending-lines")).to_have_text("0")
        expect(page.locator("#explorer-lines")).to_contain_text("No pending lines")
        expect(summary).to_contain_text("200 of 200 lines")
        assert page.evaluate("window.__sameDocument") is True
        shoot(page, "chart-done-light")
    finally:
        fake.delay = 0.0


def test_engines_page_names_the_fix(
    page: Page, browser: Browser, server: InProcessServer, fake: FakeEngine
) -> None:
    fake.info.advice = (
        "llama.cpp's fast CPU buffer types are off (the check crashed (SIGSEGV)): run "
        "`batchyard engine build --cpu` to rebuild llama-cpp-python with the fix."
    )
    try:
        page.goto(f"{server.url}/engines")
        expect(page.locator("#advice-command")).to_have_text("batchyard engine build --cpu")
        sentence = page.locator(".advice-text")
        expect(sentence.locator("code")).to_have_text("batchyard engine build --cpu")
        assert "`" not in sentence.inner_text()
        shoot(page, "engines-advice-light")
        for scheme, width, suffix in (("dark", 1280, "dark"), ("light", 390, "phone")):
            ctx = new_context(browser, scheme, width)
            other = ctx.new_page()
            other.goto(f"{server.url}/engines")
            expect(other.locator(".engine-advice")).to_contain_text("SIGSEGV")
            shoot(other, f"engines-advice-{suffix}")
            ctx.close()
    finally:
        fake.info.advice = None
