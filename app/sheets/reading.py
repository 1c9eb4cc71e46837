"""A sheet's rows as a stream: CSV and TSV (delimiter sniffed, UTF-8 only) and XLSX.

Rows are numbered as a spreadsheet numbers them: the header is row 1, the first row of
data is row 2; that number is each request's `custom_id` and what every message names.
Nothing here holds the whole sheet: rows are read one at a time, and each limit (rows,
columns, characters in a cell) is checked as the row is read.
"""

from __future__ import annotations

import codecs
import csv
import datetime as dt
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import APIError

#: The file types a sheet may be, by their names' endings.
SHEET_SUFFIXES = (".csv", ".tsv", ".xlsx")
#: Columns in one sheet (the header's width).
MAX_COLUMNS = 200
#: Characters in one cell: Excel's own limit.
MAX_CELL_CHARS = 32_767
#: Bytes read to guess a CSV's delimiter.
SNIFF_BYTES = 64 * 1024


class SheetError(APIError):
    """A sheet that cannot be read as it is: a 400 that names the row, column or limit."""

    def __init__(self, message: str, *, code: str = "invalid_sheet") -> None:
        super().__init__(400, message, param="file", code=code)


def is_sheet(filename: str) -> bool:
    return filename.lower().endswith(SHEET_SUFFIXES)


@dataclass
class SheetRows:
    """An open sheet: its columns, the names of its workbook's sheets, and its rows."""

    columns: list[str]
    rows: Iterator[tuple[int, list[str]]]
    sheet_names: list[str]
    sheet_name: str | None


@contextmanager
def open_sheet(
    path: Path,
    filename: str,
    *,
    sheet: str | None = None,
    max_rows: int | None = None,
) -> Iterator[SheetRows]:
    """Open the sheet at `path` (named `filename`, whose ending says its type); its `rows`
    yield (row number, cells) for each row of data that is not blank, every cell a string
    as the sheet shows it, as many cells as there are columns. Blank rows are skipped."""
    name = filename.lower()
    if name.endswith(".xlsx"):
        # openpyxl's read-only mode streams the sheet's XML and gives each cell's number
        # format; python-calamine reads 3x faster but holds the whole sheet, and its Python
        # binding has no formats (bench/sheets.py: the figures in bench/README.md).
        with _openpyxl(path, sheet) as opened:
            yield checked_rows(opened, max_rows)
    elif name.endswith((".csv", ".tsv")):
        with open(path, "rb") as fh:
            yield checked_rows(_csv(fh, tab=name.endswith(".tsv")), max_rows)
    else:
        raise SheetError(
            f"'{filename}' is not a sheet: batchyard reads {', '.join(SHEET_SUFFIXES)} files.",
            code="unsupported_file",
        )


def column_names(cells: list[str]) -> list[str]:
    """The column names: blank ones become column_N; a name given twice is refused."""
    while cells and not cells[-1].strip():
        cells = cells[:-1]
    if not cells:
        raise SheetError("The sheet's first row is empty: it must name the columns.")
    if len(cells) > MAX_COLUMNS:
        raise SheetError(
            f"The sheet has {len(cells)} columns; a sheet may have at most {MAX_COLUMNS}.",
            code="too_many_columns",
        )
    names: list[str] = []
    for i, cell in enumerate(cells, start=1):
        name = cell.strip() or f"column_{i}"
        if name in names:
            raise SheetError(f"The column name '{name}' appears twice in the header (row 1).")
        names.append(name)
    return names


def checked_rows(opened: SheetRows, max_rows: int | None) -> SheetRows:
    """The same rows, each padded to the header's width and checked against the limits."""
    width = len(opened.columns)

    def rows() -> Iterator[tuple[int, list[str]]]:
        count = 0
        for number, cells in opened.rows:
            while len(cells) > width and not cells[-1]:
                cells.pop()
            if not any(c.strip() for c in cells):
                continue
            if len(cells) > width:
                raise SheetError(
                    f"Row {number} has {len(cells)} cells; the header names {width} columns."
                )
            for column, cell in zip(opened.columns, cells, strict=False):
                if len(cell) > MAX_CELL_CHARS:
                    raise SheetError(
                        f"Row {number}, column '{column}' holds {len(cell)} characters; a "
                        f"cell may hold at most {MAX_CELL_CHARS}.",
                        code="cell_too_large",
                    )
            count += 1
            if max_rows is not None and count > max_rows:
                raise SheetError(
                    f"The sheet has more than {max_rows} rows of data (row {number}); a "
                    f"batch may have at most {max_rows} requests.",
                    code="too_many_rows",
                )
            if len(cells) < width:
                cells = cells + [""] * (width - len(cells))
            yield number, cells

    return SheetRows(opened.columns, rows(), opened.sheet_names, opened.sheet_name)


# -- CSV --------------------------------------------------------------------------------


def _csv(fh: Any, *, tab: bool) -> SheetRows:
    head = fh.read(SNIFF_BYTES)
    fh.seek(0)
    bom = head.startswith(codecs.BOM_UTF8)
    delimiter = "\t" if tab else _sniffed_delimiter(head)
    state = {"row": 1}

    def lines() -> Iterator[str]:
        first = True
        for raw in fh:
            if first and bom:
                raw = raw[len(codecs.BOM_UTF8) :]
            first = False
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SheetError(
                    f"Row {state['row']} is not UTF-8 (byte 0x{raw[exc.start]:02x}); save the "
                    "sheet as UTF-8 CSV and upload it again.",
                    code="not_utf8",
                ) from None

    reader = csv.reader(lines(), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise SheetError("The sheet is empty: it has no header row.") from None
    except csv.Error as exc:
        raise SheetError(f"Row 1 cannot be read as CSV: {exc}.") from None

    def rows() -> Iterator[tuple[int, list[str]]]:
        while True:
            state["row"] += 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise SheetError(f"Row {state['row']} cannot be read as CSV: {exc}.") from None
            yield state["row"], cells

    return SheetRows(column_names(header), rows(), [], None)


def _sniffed_delimiter(head: bytes) -> str:
    """The delimiter a CSV's first bytes use: comma, semicolon, tab or bar."""
    sample = head.decode("utf-8", "ignore").lstrip("\ufeff")
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:  # one column, or too little to tell
        return ","


# -- XLSX -------------------------------------------------------------------------------

_DECIMALS = re.compile(r"^[#,]*0(?:\.(0+))?(%?)$")


def shown(value: Any, number_format: str = "General") -> str:
    """A cell's value as the sheet shows it: dates as dates, whole numbers without '.0',
    fixed decimals and percentages as their format says (the common formats; others as
    General)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.datetime):
        if value.time() == dt.time(0) and not _has_time(number_format):
            return value.date().isoformat()
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, (int, float)):
        return _shown_number(value, number_format)
    return str(value)


def _shown_number(value: float, number_format: str) -> str:
    fmt = (number_format or "General").split(";")[0]
    m = _DECIMALS.match(fmt)
    if m:
        places = len(m.group(1) or "")
        grouping = "," if "," in fmt else ""
        if m.group(2):
            return f"{value * 100:{grouping}.{places}f}%"
        return f"{value:{grouping}.{places}f}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.15g}" if isinstance(value, float) else str(value)


def _has_time(number_format: str) -> bool:
    f = re.sub(r'"[^"]*"|\[[^\]]*\]', "", number_format.lower())
    return "h" in f or "s" in f


def _pick(names: list[str], sheet: str | None) -> str:
    if not names:
        raise SheetError("The workbook has no sheets.")
    if sheet in (None, ""):
        return names[0]
    if sheet not in names:
        raise SheetError(
            f"The workbook has no sheet named '{sheet}'; its sheets: {', '.join(names)}.",
            code="sheet_not_found",
        )
    return sheet


@contextmanager
def _openpyxl(path: Path, sheet: str | None) -> Iterator[SheetRows]:
    import openpyxl

    # A file object: openpyxl refuses a path whose name does not end in .xlsx, and stored
    # files are named by their ids.
    fh = open(path, "rb")  # noqa: SIM115 - closed below, after the rows are read
    try:
        book = openpyxl.load_workbook(fh, read_only=True, data_only=True)
    except Exception as exc:  # a zip that is not a workbook, or no zip at all
        fh.close()
        raise SheetError(f"The file cannot be read as an XLSX workbook: {exc}.") from None
    try:
        name = _pick(book.sheetnames, sheet)
        ws = book[name]
        it = ws.iter_rows()

        def cells(row: Any) -> list[str]:
            out = [""] * (row[-1].column if row and hasattr(row[-1], "column") else len(row))
            for i, c in enumerate(row):
                col = getattr(c, "column", None) or i + 1
                if c.value is not None:
                    out[col - 1] = shown(c.value, c.number_format)
            return out

        header: list[str] = []
        number = 0
        for row in it:
            number = row[0].row if row and getattr(row[0], "row", None) else number + 1
            header = cells(row)
            if any(h.strip() for h in header):
                break
        columns = column_names(header)

        def rows() -> Iterator[tuple[int, list[str]]]:
            n = number
            for row in it:
                n = row[0].row if row and getattr(row[0], "row", None) else n + 1
                yield n, cells(row)

        yield SheetRows(columns, rows(), list(book.sheetnames), name)
    finally:
        book.close()
        fh.close()
