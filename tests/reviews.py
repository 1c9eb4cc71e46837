"""The review sheet the sheet tests run, from `batchyard run` and from the dashboard: three
product reviews, as a CSV or as a workbook, and what every row of the answer must hold."""

from __future__ import annotations

import csv
import datetime as dt
import io

import openpyxl

LABELS = {"positive", "negative", "neutral"}
REVIEWS = [
    ("1", "Great phone, I love it"),
    ("2", "Broke after a day.\nTerrible."),  # a quoted newline
    ("3", "=1+1 is all it can count"),  # a formula, to the sheet app
]
#: The columns the answer adds after the sheet's own: the two output columns, then batchyard's.
ADDED = ["label", "helpful", "error", "finish_reason", "prompt_tokens", "completion_tokens"]


def reviews_csv() -> str:
    """id and review of each of REVIEWS, under their header."""
    buf = io.StringIO()
    csv.writer(buf).writerows([("id", "review"), *REVIEWS])
    return buf.getvalue()


def reviews_workbook(*notes: str) -> openpyxl.Workbook:
    """A workbook whose first sheet, Notes, holds `notes` as its one row (if any), and whose
    second, Reviews, holds id, review and when (a date) of each of REVIEWS."""
    book = openpyxl.Workbook()
    book.active.title = "Notes"
    if notes:
        book.active.append(list(notes))
    ws = book.create_sheet("Reviews")
    ws.append(["id", "review", "when"])
    for i, review in REVIEWS:
        ws.append([int(i), review, dt.datetime(2026, 1, int(i))])
        ws.cell(row=ws.max_row, column=2).data_type = "s"  # text, as Excel keeps '=1+1…
        ws.cell(row=ws.max_row, column=3).number_format = "yyyy-mm-dd"
    return book


def check_rows(rows: list[list[object]], first: list[str]) -> None:
    """The answer's rows: the header is `first` then ADDED, each review is kept, and its
    label, helpful, finish reason and token counts are filled in."""
    header, *body = rows
    assert header == [*first, *ADDED]
    assert [str(r[0]) for r in body] == ["1", "2", "3"]
    for row, (_, review) in zip(body, REVIEWS, strict=True):
        assert str(row[1]).lstrip("'") == review
        label, helpful, error, finish, prompt_tokens, completion_tokens = row[-6:]
        assert label in LABELS, row
        assert helpful in (True, False, "TRUE", "FALSE"), row
        assert error in ("", None) and finish == "stop", row
        assert int(str(prompt_tokens)) > 0 and int(str(completion_tokens)) > 0
