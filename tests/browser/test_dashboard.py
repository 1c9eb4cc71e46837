"""The dashboard in a real browser: drop a file, start the batch, watch it, read and download it."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from playwright.sync_api import Browser, Page, expect

from tests.browser.pages import drop_file, new_context, shoot
from tests.factories import batch_line, jsonl, jsonl_lines

#: Generous: five short lines on two CPU cores take seconds, but the model may still be warming.
RUN_TIMEOUT = 180_000


def model_id(base: str) -> str:
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        return str(json.load(r)["data"][0]["id"])


def lines_for(base: str, n: int, *, max_tokens: int = 8) -> str:
    """A file of n greedy lines req-1..req-n naming the server's own model."""
    model = model_id(base)
    lines = [
        batch_line(
            f"req-{i}",
            f"Say a word about the number {i}.",
            model=model,
            max_tokens=max_tokens,
            temperature=0,
        )
        for i in range(1, n + 1)
    ]
    return jsonl(*lines).decode()


def start_from_drop(
    page: Page, base: str, name: str, text: str, expected_lines: int, window: str = ""
) -> str:
    """Drop the file on the home page, check the preview, start the batch (in `window`, if
    given, else the card's default, 24h); returns its id."""
    page.goto(base + "/")
    drop_file(page, name, text)
    expect(page.locator("#preview-lines")).to_have_text(str(expected_lines))
    expect(page.locator("#preview")).to_contain_text("/v1/chat/completions")
    page.fill("#metadata", "purpose: browser test")
    expect(page.locator("#completion-window")).to_have_value("24h")
    if window:
        page.select_option("#completion-window", window)
    page.click("#start-batch")
    link = page.locator(".notice a")
    expect(link).to_be_visible()
    return link.inner_text().strip()


def test_drop_start_watch_and_download(
    page: Page, browser: Browser, base: str, tmp_path: Path
) -> None:
    batch_id = start_from_drop(page, base, "five.jsonl", lines_for(base, 5), 5)
    assert batch_id.startswith("batch_")

    # No reload from here on: a marker on window survives only if the page is never reloaded.
    page.evaluate("window.__sameDocument = true")
    row = page.locator(f"#row-{batch_id}")
    expect(row).to_be_visible()
    expect(row).to_have_attribute("data-status", "completed", timeout=RUN_TIMEOUT)
    expect(row.locator(".counts")).to_contain_text("5 completed")
    expect(row.locator(".counts")).to_contain_text("0 failed")
    assert page.evaluate("window.__sameDocument") is True
    # A finished list stops listening: no new event streams, no polling.
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if "/web/events" in r.url else None)
    page.wait_for_timeout(3000)
    assert streams == [], streams
    shoot(page, "home-light")

    row.locator("a.batch-id").click()
    expect(page).to_have_url(re.compile(f"/batches/{batch_id}$"))
    expect(page).to_have_title(re.compile(batch_id))
    expect(page.locator("#batch-status")).to_have_text("completed")
    expect(page.locator("#count-completed")).to_have_text("5")
    expect(page.locator(".timeline")).to_contain_text("Completed")
    rows = page.locator("#explorer-lines tbody tr")
    expect(rows).to_have_count(5)
    # Open a result: its input beside the real model's answer, and the whole response.
    rows.first.locator("a.line-open").click()
    detail = page.locator("#line-detail")
    expect(detail.locator(".input-side")).to_contain_text("Say a word about the number 1.")
    expect(detail.locator("#line-answer")).not_to_have_text(
        re.compile(r"^\s*assistant\s*\(empty\)\s*$")
    )
    detail.locator("details.raw summary").click()
    expect(detail.locator("pre.whole")).to_contain_text('"chat.completion"')
    expect(page.locator("#chart-summary")).to_contain_text("5 of 5 lines")
    shoot(page, "batch-light")

    with page.expect_download() as info:
        page.click("#download-output")
    download = info.value
    assert download.suggested_filename.endswith(".jsonl")
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    out = jsonl_lines(saved.read_text())
    assert sorted(o["custom_id"] for o in out) == [f"req-{i}" for i in range(1, 6)]
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert all(o["response"]["body"]["choices"][0]["message"]["content"] for o in out)

    # The same two pages in the dark theme, and the home page at phone width.
    for scheme, width, suffix in (("dark", 1280, "dark"), ("light", 390, "phone")):
        ctx = new_context(browser, scheme, width)
        other = ctx.new_page()
        other.goto(base + "/")
        expect(other.locator(f"#row-{batch_id}")).to_have_attribute("data-status", "completed")
        shoot(other, f"home-{suffix}")
        other.goto(f"{base}/batches/{batch_id}")
        expect(other.locator("#batch-status")).to_have_text("completed")
        shoot(other, f"batch-{suffix}")
        ctx.close()


def test_broken_file_shows_line_errors(page: Page, base: str) -> None:
    good = json.loads(lines_for(base, 1).strip())
    no_id = {k: v for k, v in good.items() if k != "custom_id"}
    text = "\n".join([json.dumps(good), "{not json", json.dumps(no_id), json.dumps(good)]) + "\n"
    page.goto(base + "/")
    # Record what the progress line said as the bytes went up (the form is replaced after).
    page.evaluate(
        """window.__progress = [];
        document.addEventListener("htmx:xhr:progress", (e) => window.__progress.push(
            [e.detail.loaded, e.detail.total, document.querySelector("#upload-bytes").textContent]));"""
    )
    drop_file(page, "broken.jsonl", text)
    errors = page.locator(".line-errors")
    expect(errors).to_be_visible()
    expect(errors).to_contain_text("Line 2")
    expect(errors).to_contain_text("invalid_json_line")
    expect(errors).to_contain_text("Line 3")
    expect(errors).to_contain_text("custom_id")
    expect(errors).to_contain_text("Line 4")
    expect(errors).to_contain_text("duplicate")
    expect(page.locator("#start-batch")).to_have_count(0)
    progress = page.evaluate("window.__progress")
    assert progress, "no upload progress events"
    loaded, total, said = progress[-1]
    assert loaded == total > len(text)  # the multipart body holds the file and the purpose
    assert re.fullmatch(r"[\d.]+ K?B of [\d.]+ K?B sent", said), said
    # Not a JSON dump: the page reads as sentences.
    assert '{"error"' not in page.content()


def test_cancel_a_running_batch(page: Page, base: str) -> None:
    n = 40
    text = lines_for(base, n, max_tokens=200)
    batch_id = start_from_drop(page, base, "long.jsonl", text, n, window="1h")
    row = page.locator(f"#row-{batch_id}")
    expect(row).to_have_attribute("data-status", "in_progress", timeout=RUN_TIMEOUT)
    expect(row.locator(".rate")).to_be_visible(timeout=RUN_TIMEOUT)
    # Its 1 h window's end, and once lines finish, its projected finish, live in the row.
    expect(row.locator(".deadline")).to_contain_text("deadline in 1 h")
    expect(row.locator(".eta")).to_contain_text("finishes", timeout=RUN_TIMEOUT)
    shoot(page, "home-running-light")

    # Its input file is deleted as on OpenAI: gone from the list at once, while the batch
    # keeps reading its bytes and runs on.
    page.goto(base + "/files")
    file_row = page.locator("table.files tr", has_text="long.jsonl")
    page.once("dialog", lambda dialog: dialog.accept())
    file_row.get_by_role("button", name="Delete long.jsonl").click()
    expect(page.locator("table.files tr", has_text="long.jsonl")).to_have_count(0)
    page.reload()
    expect(page.locator("table.files tr", has_text="long.jsonl")).to_have_count(0)

    page.goto(f"{base}/batches/{batch_id}")
    expect(page.locator("#batch-status")).to_have_text("in progress", timeout=RUN_TIMEOUT)
    expect(page.locator(".throughput")).to_contain_text("tokens/s for this batch")
    # The real engine's lines move through the explorer and the chart while it runs.
    expect(page.locator("#count-succeeded-lines")).not_to_have_text("0", timeout=RUN_TIMEOUT)
    expect(page.locator("#chart-summary")).to_contain_text("ETA", timeout=RUN_TIMEOUT)
    expect(page.locator("#batch-finish")).to_be_visible(timeout=RUN_TIMEOUT)
    expect(page.locator("#batch-deadline")).to_contain_text("in 1 h")
    # The engine's live figure arrives through the stream and moves off zero while it decodes.
    expect(page.locator("#engine-rate")).to_be_visible()
    expect(page.locator("#engine-rate")).not_to_have_text(
        re.compile(r"^0\.0$"), timeout=RUN_TIMEOUT
    )
    page.wait_for_timeout(3000)  # a few more samples for the throughput bars
    shoot(page, "batch-running-light")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-batch")
    expect(page.locator("#batch-status")).to_have_text(re.compile("cancell(ing|ed)"))
    expect(page.locator("#batch-status")).to_have_text("cancelled", timeout=RUN_TIMEOUT)
    expect(page.locator(".timeline")).to_contain_text("Cancelled")
    done = int(page.locator("#count-completed").inner_text()) + int(
        page.locator("#count-failed").inner_text()
    )
    assert done < n
    expect(page.locator("#cancel-batch")).to_have_count(0)


def test_files_and_model_pages(page: Page, base: str) -> None:
    page.goto(base + "/files")
    expect(page).to_have_title(re.compile("Files"))
    expect(page.locator("table.files")).to_contain_text("five.jsonl")
    expect(page.locator("table.files")).to_contain_text("batch_output")
    shoot(page, "files-light")
    # A file no batch uses goes at once.
    broken = page.locator("table.files tr", has_text="broken.jsonl")
    expect(broken).to_have_count(1)
    page.once("dialog", lambda dialog: dialog.accept())
    broken.get_by_role("button", name="Delete broken.jsonl").click()
    expect(page.locator("table.files tr", has_text="broken.jsonl")).to_have_count(0)
    page.reload()
    expect(page.locator("table.files")).not_to_contain_text("broken.jsonl")

    page.goto(base + "/engines")
    expect(page).to_have_title(re.compile("Engines"))
    facts = page.locator("dl.facts").first
    expect(facts).to_contain_text("Quantisation")
    expect(facts).to_contain_text("CPU")
    expect(page.locator("#engine-stats")).to_contain_text("Tokens/s")
    shoot(page, "engines-light")


def test_api_docs_load_offline(page: Page, base: str) -> None:
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(base) else None)
    page.goto(base + "/schema")
    expect(page.locator(".swagger-ui")).to_be_visible()
    expect(page.locator(".swagger-ui")).to_contain_text("/v1/batches")
    assert outside == [], outside
