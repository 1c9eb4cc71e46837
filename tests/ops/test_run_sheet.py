"""`batchyard run` on a sheet: a CSV in and an XLSX out, and the other way round, on the real
engine and the real default model, with two output columns answered through the grammar."""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

import openpyxl

from tests.factories import jsonl_lines
from tests.live import batchyard
from tests.reviews import check_rows, reviews_csv, reviews_workbook

SMALL = ("--parallel", "2", "--ctx-size", "512")
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


def test_run_a_csv_to_an_xlsx_with_output_columns(tmp_path: Path) -> None:
    src = tmp_path / "reviews.csv"
    src.write_text(reviews_csv(), encoding="utf-8")
    out = tmp_path / "labelled.xlsx"

    done = batchyard("run", str(src), *SHEET_ARGS, "-o", str(out), *SMALL, timeout=300)

    assert done.returncode == 0, done.stderr
    assert "3 rows succeeded, 0 failed" in done.stderr
    assert "progress: 3/3 lines (100%)" in done.stderr
    ws = openpyxl.load_workbook(out).active
    assert all(c.data_type != "f" for row in ws.iter_rows() for c in row)
    assert ws["B4"].value == "=1+1 is all it can count" and ws["B4"].data_type == "s"
    check_rows([[c.value for c in row] for row in ws.iter_rows()], ["id", "review"])
    # An ordinary batch underneath: its input file holds one request per row, by row number.
    state = tmp_path / "labelled.xlsx.batchyard-state"
    with sqlite3.connect(state / "batchyard.db") as db:
        ((metadata, input_file),) = db.execute("select metadata, input_file_id from batch")
    assert metadata == '{"sheet": "reviews.csv"}'
    lines = jsonl_lines((state / "files" / input_file).read_text())
    assert [line["custom_id"] for line in lines] == ["2", "3", "4"]


def test_run_an_xlsx_to_a_csv(tmp_path: Path) -> None:
    src = tmp_path / "reviews.xlsx"
    reviews_workbook().save(src)
    out = tmp_path / "labelled.csv"

    done = batchyard(
        "run", str(src), *SHEET_ARGS, "--sheet", "Reviews", "-o", str(out), *SMALL, timeout=300
    )

    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(io.StringIO(out.read_text(encoding="utf-8-sig"))))
    assert [r[2] for r in rows[1:]] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert rows[3][1] == "'=1+1 is all it can count"  # written as text
    check_rows([[*r[:2], *r[3:]] for r in rows], ["id", "review"])


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
