"""`batchyard run` on a sheet: a CSV in and an XLSX out, and the other way round, on the real
engine and the real default model, with two output columns answered through the grammar."""

from __future__ import annotations

import csv
import datetime as dt
import io
import sqlite3
from pathlib import Path

import openpyxl

from tests.live import batchyard

SMALL = ("--parallel", "2", "--ctx-size", "512")
LABELS = {"positive", "negative", "neutral"}
REVIEWS = [
    ("1", "Great phone, I love it"),
    ("2", "Broke after a day.\nTerrible."),  # a quoted newline
    ("3", "=1+1 is all it can count"),  # a formula, to the sheet app
]
SHEET_ARGS = (
    "--prompt",
    "Classify this review: {{ review }}",
    "--system",
    "You label product reviews.",
    "--columns",
    "label:one of positive,negative,neutral",
    "--columns",
    "helpful:boolean",
    "--max-tokens",
    "40",
    "--temperature",
    "0",
)


def check_rows(rows: list[list[object]]) -> None:
    header, *body = rows
    assert header == [
        "id", "review", "label", "helpful", "error", "finish_reason", "prompt_tokens",
        "completion_tokens",
    ]  # fmt: skip
    assert [r[0] for r in body] == ["1", "2", "3"]
    for row, (_, review) in zip(body, REVIEWS, strict=True):
        assert str(row[1]).lstrip("'") == review
        assert row[2] in LABELS, row
        assert row[3] in (True, False, "TRUE", "FALSE"), row
        assert row[4] in ("", None) and row[5] == "stop", row
        assert int(str(row[6])) > 0 and int(str(row[7])) > 0


def test_run_a_csv_to_an_xlsx_with_output_columns(tmp_path: Path) -> None:
    src = tmp_path / "reviews.csv"
    buf = io.StringIO()
    csv.writer(buf).writerows([("id", "review"), *REVIEWS])
    src.write_text(buf.getvalue(), encoding="utf-8")
    out = tmp_path / "labelled.xlsx"

    done = batchyard("run", str(src), *SHEET_ARGS, "-o", str(out), *SMALL, timeout=300)

    assert done.returncode == 0, done.stderr
    assert "3 rows succeeded, 0 failed" in done.stderr
    assert "progress: 3/3 lines (100%)" in done.stderr
    ws = openpyxl.load_workbook(out).active
    assert all(c.data_type != "f" for row in ws.iter_rows() for c in row)
    assert ws["B4"].value == "=1+1 is all it can count" and ws["B4"].data_type == "s"
    check_rows([[c.value for c in row] for row in ws.iter_rows()])
    # An ordinary batch underneath: its input file holds one request per row, by row number.
    state = tmp_path / "labelled.xlsx.batchyard-state"
    with sqlite3.connect(state / "batchyard.db") as db:
        ((metadata, input_file),) = db.execute("select metadata, input_file_id from batch")
    assert metadata == '{"sheet": "reviews.csv"}'
    lines = (state / "files" / input_file).read_text().splitlines()
    assert [line.split('"custom_id": "')[1][0] for line in lines] == ["2", "3", "4"]


def test_run_an_xlsx_to_a_csv(tmp_path: Path) -> None:
    src = tmp_path / "reviews.xlsx"
    book = openpyxl.Workbook()
    book.active.title = "Notes"
    ws = book.create_sheet("Reviews")
    ws.append(["id", "review", "when"])
    for i, review in REVIEWS:
        ws.append([int(i), review, dt.datetime(2026, 1, int(i))])
        ws.cell(row=ws.max_row, column=2).data_type = "s"  # text, as Excel keeps '=1+1…
        ws.cell(row=ws.max_row, column=3).number_format = "yyyy-mm-dd"
    book.save(src)
    out = tmp_path / "labelled.csv"

    done = batchyard(
        "run", str(src), *SHEET_ARGS, "--sheet", "Reviews", "-o", str(out), *SMALL, timeout=300
    )

    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(io.StringIO(out.read_text(encoding="utf-8-sig"))))
    assert [r[2] for r in rows[1:]] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert rows[3][1] == "'=1+1 is all it can count"  # written as text
    check_rows([[*r[:2], *r[3:]] for r in rows])


def test_a_template_naming_a_missing_column_is_refused_before_a_batch(tmp_path: Path) -> None:
    src = tmp_path / "reviews.csv"
    src.write_text("id,review\n1,fine\n", encoding="utf-8")
    out = tmp_path / "out.csv"

    done = batchyard("run", str(src), "--prompt", "{{ reveiw }}", "-o", str(out))

    assert done.returncode == 1, done.stderr
    assert "'reveiw'" in done.stderr and "Its columns: id, review" in done.stderr
    with sqlite3.connect(tmp_path / "out.csv.batchyard-state" / "batchyard.db") as db:
        assert db.execute("select count(*) from batch").fetchone() == (0,)
    assert not out.exists()
    bad = batchyard("run", str(src), "--prompt", "{{ review }}", "-o", str(tmp_path / "o.jsonl"))
    assert bad.returncode == 2 and "a .csv or an .xlsx file" in bad.stderr
