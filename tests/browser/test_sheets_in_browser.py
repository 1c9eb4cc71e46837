"""A sheet on the dashboard in a real browser: drop a CSV (then an XLSX), write the template
and two output columns, start, wait, download the sheet back and read its rows."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import openpyxl
from playwright.sync_api import Page, expect

from tests.browser.pages import drop_file, htmx_idle, shoot
from tests.reviews import check_rows, reviews_csv, reviews_workbook

#: Three short rows on two CPU cores take seconds, but the model may still be warming.
RUN_TIMEOUT = 180_000


def fill_form(page: Page) -> None:
    page.fill("#sheet-template", "Classify this review: {{ review }}")
    page.fill("#sheet-system", "You label product reviews.")
    page.fill("#sheet-max-tokens", "40")
    page.fill("#sheet-temperature", "0")
    rows = page.locator("#output-columns .output-column")
    rows.nth(0).locator("[name=col_name]").fill("label")
    rows.nth(0).locator("[name=col_type]").select_option("one of")
    rows.nth(0).locator("[name=col_choices]").fill("positive, negative, neutral")
    rows.nth(1).locator("[name=col_name]").fill("helpful")
    rows.nth(1).locator("[name=col_type]").select_option("boolean")
    preview = page.locator("#sheet-preview")
    expect(preview).to_contain_text("Classify this review: Great phone, I love it")
    expect(preview).to_contain_text("You label product reviews.")
    expect(page.locator("#sheet-estimate")).to_contain_text("3 rows")
    expect(preview).to_contain_text('"enum": ["positive", "negative", "neutral"]')
    expect(page.locator("#sheet-start-result")).to_be_empty()  # an earlier refusal is gone


def start_and_wait(page: Page, base: str) -> str:
    page.click("#sheet-start")
    link = page.locator(".notice a")
    expect(link).to_be_visible()
    batch_id = link.inner_text().strip()
    page.goto(f"{base}/batches/{batch_id}")
    expect(page.locator("#sheet-downloads")).to_contain_text("reviews.")
    expect(page.locator("#download-sheet-csv")).to_be_visible(timeout=RUN_TIMEOUT)
    expect(page.locator("#batch-status")).to_have_text("completed")
    return batch_id


def download(page: Page, selector: str, tmp_path: Path) -> Path:
    with page.expect_download() as info:
        page.click(selector)
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    return path


def test_drop_a_csv_write_the_template_and_download_the_sheet(
    page: Page, base: str, tmp_path: Path
) -> None:
    page.goto(base + "/")
    drop_file(page, "reviews.csv", reviews_csv().encode("utf-8-sig"), type="")

    columns = page.locator("#sheet-columns")
    expect(columns.locator("thead")).to_contain_text("review")
    expect(columns.locator("tbody tr")).to_have_count(3)
    # A column the sheet lacks is refused, by name, in the preview and at Start.
    page.fill("#sheet-template", "{{ reveiw }}")
    expect(page.locator("#sheet-preview")).to_contain_text("'reveiw'")
    page.click("#sheet-start")
    expect(page.locator("#sheet-start-result")).to_contain_text("Its columns: id, review")

    fill_form(page)
    # The model is loaded: its own tokenizer counted the first rows (here, all three).
    estimate = page.locator("#sheet-estimate")
    expect(estimate).to_contain_text("own tokenizer")
    estimated = int(estimate.locator("strong").inner_text().replace(",", ""))
    shoot(page, "sheet-form")
    batch_id = start_and_wait(page, base)
    shoot(page, "sheet-batch")

    path = download(page, "#download-sheet-csv", tmp_path)
    assert path.name == f"reviews.{batch_id}.csv"
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    assert rows[3][1] == "'=1+1 is all it can count"  # a formula, written as text
    check_rows(rows, ["id", "review"])  # type: ignore[arg-type]
    counted = sum(int(row[-2]) for row in rows[1:])  # the prompt tokens the lines took
    assert abs(estimated - counted) <= 0.15 * counted, (estimated, counted)


def test_drop_an_xlsx_choose_its_sheet_and_download_xlsx(
    page: Page, base: str, tmp_path: Path
) -> None:
    data = io.BytesIO()
    reviews_workbook("nothing here").save(data)
    page.goto(base + "/")
    drop_file(page, "reviews.xlsx", data.getvalue(), type="")

    expect(page.locator("#sheet-columns thead")).to_contain_text("nothing here")
    htmx_idle(page)  # the form and its first preview are in: the select's change is heard
    page.select_option("#sheet-name", "Reviews")
    expect(page.locator("#sheet-columns thead")).to_contain_text("when")
    expect(page.locator("#sheet-columns tbody")).to_contain_text("2026-01-02")

    fill_form(page)
    batch_id = start_and_wait(page, base)

    path = download(page, "#download-sheet-xlsx", tmp_path)
    assert re.fullmatch(rf"reviews\.{batch_id}\.xlsx", path.name)
    sheet = openpyxl.load_workbook(path).active
    assert sheet.title == "Reviews"
    assert all(c.data_type != "f" for row in sheet.iter_rows() for c in row)
    rows = [[c.value for c in row] for row in sheet.iter_rows()]
    assert [r[2] for r in rows[1:]] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    check_rows([[*r[:2], *r[3:]] for r in rows], ["id", "review"])
