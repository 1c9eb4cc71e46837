"""A finished sheet batch back as a sheet: the rows in order, the answers, the errors.

The batch's output and error files are in input order, and so are the sheet's rows, so the
join is a merge of three streams by row number: nothing is held but the current row.
Every text cell that a spreadsheet would take for a formula (it starts with =, +, -, @, a
tab or a carriage return) is written as text: CSV cells get a leading apostrophe, XLSX
cells are typed as strings (OWASP's advice on CSV injection).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from app.sheets.requests import REASONING, OutputColumn
from app.wire.thoughts import answer_thought

#: The columns every joined sheet ends with, after the answer's (and the thought's).
TRAILING = ("error", "finish_reason", "prompt_tokens", "completion_tokens")
ANSWER = "answer"
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
#: Characters an XLSX cell cannot hold (XML 1.0's control characters).
_ILLEGAL_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
FORMATS = ("csv", "xlsx")


def is_formula_like(text: str) -> bool:
    return text.startswith(FORMULA_START) and not _PLAIN_NUMBER.match(text)


def csv_safe(value: Any) -> Any:
    if isinstance(value, str) and is_formula_like(value):
        return "'" + value
    return value


def added_columns(output_columns: list[OutputColumn], keep_reasoning: bool = False) -> list[str]:
    """The answer's columns (or `answer`), the thought's with `keep_reasoning`, then TRAILING."""
    answer = [c.name for c in output_columns] if output_columns else [ANSWER]
    return [*answer, *([REASONING] if keep_reasoning else []), *TRAILING]


def _by_row(lines: Iterable[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    for raw in lines:
        if raw.strip():
            line = json.loads(raw)
            yield int(line["custom_id"]), line


class _Cursor:
    """The next line of one result file, by row number."""

    def __init__(self, lines: Iterable[bytes]) -> None:
        self._it = _by_row(lines)
        self._next = next(self._it, None)

    def take(self, number: int) -> dict[str, Any] | None:
        while self._next is not None and self._next[0] < number:
            self._next = next(self._it, None)
        if self._next is not None and self._next[0] == number:
            line = self._next[1]
            self._next = next(self._it, None)
            return line
        return None


def result_cells(
    line: dict[str, Any] | None, columns: list[OutputColumn], keep_reasoning: bool = False
) -> list[Any]:
    """The added cells of one row from its output or error line (None: it has none). The
    answer's cells come from the message's `content` alone, never from a thinking model's
    thought, which `keep_reasoning` adds in a column of its own."""
    response = (line or {}).get("response") or {}
    body = response.get("body") or {}
    usage = body.get("usage") or {}
    tokens = [usage.get("prompt_tokens", ""), usage.get("completion_tokens", "")]
    thought = answer_thought(body)
    cells, error, finish = _answer_cells(line, body, columns)
    return [*cells, *([thought] if keep_reasoning else []), error, finish, *tokens]


def _answer_cells(
    line: dict[str, Any] | None, body: dict[str, Any], columns: list[OutputColumn]
) -> tuple[list[Any], str, str]:
    """(the answer's cells, the error, finish_reason) of one row."""
    blank = [""] * max(1, len(columns))
    if line is None:
        return blank, "the row has no result (the batch did not run it)", ""
    response = line.get("response") or {}
    error = line.get("error") or body.get("error")
    if error or response.get("status_code") not in (None, 200):
        return blank, (error or {}).get("message") or f"status {response.get('status_code')}", ""
    choice = (body.get("choices") or [{}])[0]
    finish = choice.get("finish_reason") or ""
    content = (choice.get("message") or {}).get("content") or ""
    if not columns:
        return [content], "", finish
    try:
        fields = json.loads(content)
        if not isinstance(fields, dict):
            raise ValueError("not an object")
    except ValueError:
        if finish == "length" and not content and answer_thought(body):
            why = "the thought took every one of max_tokens: no answer"
            return blank, f"{why} (raise max_tokens, or ask for less reasoning)", finish
        why = "the answer was cut at max_tokens" if finish == "length" else "the answer"
        return blank, f"{why} is not the JSON object asked for: {content}", finish
    cells = []
    for c in columns:
        value = fields.get(c.name, "")
        cells.append(value if isinstance(value, (str, int, float, bool)) else json.dumps(value))
    return cells, "", finish


def joined_rows(
    rows: Iterable[tuple[int, list[str]]],
    output: Iterable[bytes],
    errors: Iterable[bytes],
    columns: list[OutputColumn],
    keep_reasoning: bool = False,
) -> Iterator[list[Any]]:
    """Each row's cells, then its added cells; rows in their order."""
    out, err = _Cursor(output), _Cursor(errors)
    for number, cells in rows:
        line = out.take(number) or err.take(number)
        yield [*cells, *result_cells(line, columns, keep_reasoning)]


def write_csv(dest: BinaryIO, header: list[str], rows: Iterable[list[Any]]) -> None:
    """UTF-8 with a BOM (so that Excel reads it as UTF-8), every cell made formula-safe."""
    text = io.TextIOWrapper(dest, encoding="utf-8-sig", newline="", write_through=False)
    try:
        w = csv.writer(text)
        w.writerow([csv_safe(h) for h in header])
        for row in rows:
            w.writerow([_csv_value(v) for v in row])
    finally:
        text.flush()
        text.detach()


def _csv_value(v: Any) -> Any:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    return csv_safe(v)


def write_xlsx(dest: BinaryIO, header: list[str], rows: Iterable[list[Any]], title: str) -> None:
    """One sheet, written row by row (openpyxl's write-only mode); text cells are typed as
    strings, so no cell is ever a formula."""
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell

    book = Workbook(write_only=True)
    ws = book.create_sheet(title=_sheet_title(title))

    def cell(value: Any) -> Any:
        if isinstance(value, str):
            c = WriteOnlyCell(ws, value=_ILLEGAL_XML.sub("", value))
            c.data_type = "s"  # openpyxl would make '=...' a formula
            return c
        return value

    ws.append([cell(h) for h in header])
    for row in rows:
        ws.append([cell(v) for v in row])
    book.save(dest)


def _sheet_title(title: str) -> str:
    return re.sub(r"[\[\]:*?/\\]", "_", title)[:31] or "Sheet1"
