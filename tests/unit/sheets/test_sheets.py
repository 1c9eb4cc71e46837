"""Sheets in and out on a real SQLite file and real files: reading CSV and XLSX as a user
saves them, the template's checks, the join of a finished batch back to the rows, and the
formula escaping of what is written. The engine is the fake (bookkeeping only)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import openpyxl
import pytest

from app.errors import APIError
from app.services import Services
from app.sheets.reading import SheetError, open_sheet
from app.sheets.requests import OutputColumn, RowTemplate, SheetSpec, parse_column
from app.sheets.writing import write_csv, write_xlsx
from app.tables import BatchStatus
from tests.factories import jsonl_lines
from tests.fakes import FakeEngine
from tests.unit.helpers import drive, file_rows, services


def rows_of(path: Path, **kw: object) -> tuple[list[str], list[tuple[int, list[str]]]]:
    with open_sheet(path, path.name, **kw) as opened:  # type: ignore[arg-type]
        return opened.columns, list(opened.rows)


def test_csv_delimiter_bom_quoted_newlines_and_blank_rows(tmp_path: Path) -> None:
    p = tmp_path / "reviews.csv"
    p.write_bytes(
        b'\xef\xbb\xbfid;review;note\r\n1;"two\r\nlines; and a ;";x\r\n\r\n2;caf\xc3\xa9;\r\n3\r\n'
    )
    columns, rows = rows_of(p)
    assert columns == ["id", "review", "note"]
    assert rows == [
        (2, ["1", "two\r\nlines; and a ;", "x"]),
        (4, ["2", "café", ""]),
        (5, ["3", "", ""]),
    ]


def test_tsv_and_a_blank_header_cell(tmp_path: Path) -> None:
    p = tmp_path / "t.tsv"
    p.write_text("a\t\tc\n1\t2\t3\n", encoding="utf-8")
    assert rows_of(p) == (["a", "column_2", "c"], [(2, ["1", "2", "3"])])


def test_other_encodings_are_refused_naming_the_row(tmp_path: Path) -> None:
    p = tmp_path / "latin1.csv"
    p.write_bytes('id,name\n1,ok\n2,"multi\nline"\n3,caf\u00e9\n'.encode("latin-1"))
    with pytest.raises(SheetError, match=r"Row 4 is not UTF-8 \(byte 0xe9\)"):
        rows_of(p)


def test_limits_state_the_limit(tmp_path: Path) -> None:
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(201)) + "\n", encoding="utf-8")
    with pytest.raises(SheetError, match="at most 200"):
        rows_of(wide)
    big = tmp_path / "big.csv"
    big.write_text("a\n" + "x" * 40_000 + "\n", encoding="utf-8")
    with pytest.raises(
        SheetError, match=r"Row 2, column 'a' holds 40000 characters; .* at most 32767"
    ):
        rows_of(big)
    many = tmp_path / "many.csv"
    many.write_text("a\n" + "x\n" * 5, encoding="utf-8")
    with pytest.raises(SheetError, match="at most 4 requests"):
        rows_of(many, max_rows=4)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b\n1,2\n1,2,3\n", encoding="utf-8")
    with pytest.raises(SheetError, match="Row 3 has 3 cells; the header names 2"):
        rows_of(ragged)


def test_xlsx_first_or_chosen_sheet_dates_and_numbers_as_shown(tmp_path: Path) -> None:
    p = tmp_path / "book.xlsx"
    book = openpyxl.Workbook()
    ws = book.active
    ws.title = "First"
    ws.append(["when", "amount", "count", "text"])
    ws.append([dt.datetime(2026, 3, 1), 12.5, 3, "hello"])
    ws.append([None, None, None, None])
    ws.append([dt.datetime(2026, 3, 2, 14, 30), 0.1, 4.0, "world"])
    ws["A2"].number_format = "yyyy-mm-dd"  # as a date typed into Excel is shown
    other = book.create_sheet("Second")
    other.append(["name"])
    other.append(["Ada"])
    book.save(p)

    columns, rows = rows_of(p)
    assert columns == ["when", "amount", "count", "text"]
    assert rows[0] == (2, ["2026-03-01", "12.5", "3", "hello"])
    assert rows[1][0] == 4 and rows[1][1][1:3] == ["0.1", "4"]
    assert rows[1][1][0].startswith("2026-03-02 14:30")
    assert rows_of(p, sheet="Second") == (["name"], [(2, ["Ada"])])
    with pytest.raises(SheetError, match="no sheet named 'Nope'; its sheets: First, Second"):
        rows_of(p, sheet="Nope")


def test_number_formats_are_shown_as_formatted(tmp_path: Path) -> None:
    p = tmp_path / "fmt.xlsx"
    book = openpyxl.Workbook()
    ws = book.active
    ws.append(["price", "share"])
    ws.append([1234.5, 0.256])
    ws["A2"].number_format = "#,##0.00"
    ws["B2"].number_format = "0.0%"
    book.save(p)
    assert rows_of(p)[1] == [(2, ["1,234.50", "25.6%"])]


def test_template_refuses_a_missing_column_by_name_and_runs_sandboxed() -> None:
    spec = SheetSpec(template="Review: {{ review }} by {{ author }}", model="m")
    with pytest.raises(APIError, match="'author'") as exc:
        RowTemplate(spec, ["id", "review"])
    assert exc.value.code == "unknown_column" and exc.value.status_code == 400
    unsafe = SheetSpec(template="{{ review.__class__.__mro__ }}", model="m")
    t = RowTemplate(unsafe, ["review"])
    with pytest.raises(Exception, match=r"unsafe|not safely|access"):
        t.messages(["x"])
    ok = RowTemplate(
        SheetSpec(template='{{ row["first name"] }}: {{ id }}', model="m"), ["id", "first name"]
    )
    assert ok.messages(["7", "Ada"]) == [{"role": "user", "content": "Ada: 7"}]


def test_output_columns_become_a_strict_json_schema() -> None:
    cols = [parse_column("label:one of positive, negative,neutral"), parse_column("score:number")]
    assert cols[0] == OutputColumn("label", "one of", ["positive", "negative", "neutral"])
    t = RowTemplate(SheetSpec(template="{{ a }}", model="m", output_columns=cols), ["a"])
    schema = t.body(["x"])["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["label"]["enum"] == ["positive", "negative", "neutral"]
    assert schema["properties"]["score"] == {"type": "number"}
    assert schema["required"] == ["label", "score"]


def test_formula_like_cells_are_written_as_text(tmp_path: Path) -> None:
    header = ["a", "b"]
    rows = [
        ['=HYPERLINK("http://x")', "+1+2"],
        ["@SUM(A1)", "-3"],
        ["\tTAB", "\rCR"],
        ["-cmd|x", 2.5],
    ]
    buf = io.BytesIO()
    write_csv(buf, header, rows)
    back = list(csv.reader(io.StringIO(buf.getvalue().decode("utf-8-sig"))))
    assert back[1:] == [
        ['\'=HYPERLINK("http://x")', "'+1+2"],
        ["'@SUM(A1)", "-3"],  # a plain number stays a number
        ["'\tTAB", "'\rCR"],
        ["'-cmd|x", "2.5"],
    ]
    x = tmp_path / "out.xlsx"
    with open(x, "wb") as fh:
        write_xlsx(fh, header, rows, "t")
    ws = openpyxl.load_workbook(x).active
    cells = [c for row in ws.iter_rows() for c in row]
    assert all(c.data_type != "f" for c in cells)
    assert ws["A2"].value == '=HYPERLINK("http://x")' and ws["A2"].data_type == "s"
    assert ws["B5"].value == 2.5


def _sheet_services(tmp_path: Path) -> Services:
    from tests.unit.helpers import services as make

    return make(tmp_path / "data", FakeEngine())


def test_start_and_export_join_rows_in_order_with_failed_rows_kept(tmp_path: Path) -> None:
    svc = _sheet_services(tmp_path)
    src = "id,question\n" + "".join(
        f"{i},{'FAIL ' if i == 3 else ''}question {i}\n" for i in range(1, 6)
    )
    stored = svc.sheets.store(io.BytesIO(src.encode()), "q.csv", "")
    with pytest.raises(APIError, match="'answerr'"):
        svc.sheets.start("", stored.id, SheetSpec(template="{{ answerr }}", model="m"))
    assert svc.batches.list("", limit=10)[0] == []  # refused before a batch was made
    batch = svc.sheets.start("", stored.id, SheetSpec(template="Q: {{ question }}", model="m"))
    assert batch.endpoint == "/v1/chat/completions"
    done = drive(svc, batch.id)
    assert done.status == BatchStatus.COMPLETED and done.failed == 1
    lines = jsonl_lines(svc.storage.path(batch.input_file_id).read_text())
    assert [line["custom_id"] for line in lines] == [
        "2",
        "3",
        "4",
        "5",
        "6",
    ]

    out = io.BytesIO()
    name = svc.sheets.export(batch.id, "", "csv", out)
    assert name == f"q.{batch.id}.csv"
    table = list(csv.DictReader(io.StringIO(out.getvalue().decode("utf-8-sig"))))
    assert [r["id"] for r in table] == ["1", "2", "3", "4", "5"]
    assert table[0]["answer"] == "echo: Q: question 1"
    assert table[0]["finish_reason"] == "stop" and table[0]["error"] == ""
    assert table[2]["answer"] == "" and "longer than the context" in table[2]["error"]
    assert int(table[1]["prompt_tokens"]) > 0


def test_a_sheet_with_no_rows_is_refused_and_stores_no_input_file(tmp_path: Path) -> None:
    svc = _sheet_services(tmp_path)
    stored = svc.sheets.store(io.BytesIO(b"id,question\n"), "empty.csv", "")
    with pytest.raises(SheetError, match="no rows of data under its header"):
        svc.sheets.start("", stored.id, SheetSpec(template="Q: {{ question }}", model="m"))
    assert svc.batches.list("", limit=10)[0] == []
    assert [f.id for f in file_rows(svc)] == [stored.id]  # no batch input file was kept
    assert [file_id for file_id, _age in svc.storage.stored_files()] == [stored.id]


def test_export_is_refused_for_a_batch_not_made_from_a_sheet(tmp_path: Path) -> None:
    from tests.factories import batch_line
    from tests.unit.helpers import make_batch

    svc = services(tmp_path / "data", FakeEngine())
    batch_id = make_batch(svc, [batch_line("a", "hi")])
    drive(svc, batch_id)
    with pytest.raises(APIError, match="not made from a sheet"):
        svc.sheets.export(batch_id, "", "csv", io.BytesIO())


def test_the_token_estimate_counts_every_row_without_rendering_them_again(
    tmp_path: Path,
) -> None:
    svc = _sheet_services(tmp_path)
    rows = [(f"question number {i} " * (i % 4 + 1), str(i)) for i in range(40)]
    text = "q,n,unused\n" + "".join(f'"{q}",{n},{"x" * 50}\n' for q, n in rows)
    stored = svc.sheets.store(io.BytesIO(text.encode()), "q.csv", "")
    spec = SheetSpec(template="Q: {{ q }}!", system="Row {{ n }}.", model="m")

    preview = svc.sheets.preview(stored.id, "", spec)

    t = RowTemplate(spec, ["q", "n", "unused"])
    rendered = sum(len(m["content"]) for q, n in rows for m in t.messages([q, n, "x" * 50]))
    assert preview.rows == 40 and preview.tokens == -(-rendered // 4)
    assert [r.row for r in preview.requests] == [2, 3, 4]
    assert preview.requests[0].messages[1]["content"] == f"Q: {rows[0][0]}!"
