"""Sheets in and out at 100,000 rows: seconds and peak RSS of reading and of writing.

    python bench/sheets.py [--rows 100000] [--rounds 1]

Makes one CSV and one XLSX of N rows (id, a review of about 80 characters, a score, a
date), and an output file of N answers as a finished batch holds them. Each measurement
runs in a child process of its own, so that its peak RSS (getrusage) is its own:

- read: the sheet's rows through app/sheets (open_sheet, the template, request_lines) into
  a JSONL input file, as `SheetService.start` writes it: CSV; XLSX with openpyxl's
  read-only mode; XLSX with python-calamine.
- write: the rows joined with the output file (app/sheets/writing) into a CSV and an XLSX.

Prints seconds, peak RSS and the RSS over the child's baseline (its imports), and the
calamine/openpyxl ratios. python-calamine is not a dependency: `pip install python-calamine`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORDS = "the battery lasts two days and the screen is bright but the speaker rattles a lot".split()
MODES = ("read-csv", "read-xlsx-openpyxl", "read-xlsx-calamine", "write-csv", "write-xlsx")


def review(i: int) -> str:
    """About 80 characters, each row's its own (a sheet of distinct texts)."""
    return f"#{i} " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(13))


def make_inputs(folder: Path, rows: int) -> None:
    import csv

    from openpyxl import Workbook

    with open(folder / "sheet.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "review", "score", "date"])
        for i in range(rows):
            w.writerow([i, review(i), i % 5, (dt.date(2026, 1, 1) + dt.timedelta(i % 365))])
    book = Workbook(write_only=True)
    ws = book.create_sheet("Reviews")
    ws.append(["id", "review", "score", "date"])
    for i in range(rows):
        ws.append([i, review(i), i % 5, dt.datetime(2026, 1, 1) + dt.timedelta(i % 365)])
    book.save(folder / "sheet.xlsx")
    with open(folder / "output.jsonl", "w", encoding="utf-8") as fh:
        for i in range(rows):
            body = {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": '{"label": "positive"}'},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48},
            }
            line = {"id": f"r{i}", "custom_id": str(i + 2), "error": None,
                    "response": {"status_code": 200, "request_id": f"q{i}", "body": body}}  # fmt: skip
            fh.write(json.dumps(line) + "\n")


def calamine_rows(path: Path) -> Any:
    """The first sheet's rows by python-calamine, through the same checks and cell text as
    app/sheets/reading.py's openpyxl reader (the one batchyard uses)."""
    from python_calamine import CalamineWorkbook

    from app.sheets.reading import SheetRows, checked_rows, column_names, shown

    book = CalamineWorkbook.from_path(str(path))
    name = book.sheet_names[0]
    it = iter(book.get_sheet_by_name(name).iter_rows())
    columns = column_names([shown(v) for v in next(it)])

    def rows() -> Iterator[tuple[int, list[str]]]:
        for n, row in enumerate(it, start=2):
            yield n, [shown(v) for v in row]

    return checked_rows(SheetRows(columns, rows(), list(book.sheet_names), name), None)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, folder: Path) -> dict[str, float]:
    """One measurement, in this process (the parent runs each in a fresh one)."""
    sys.path.insert(0, str(ROOT))
    import openpyxl  # noqa: F401  (imported before the baseline, as in a server)
    import python_calamine  # noqa: F401

    from app.sheets.reading import open_sheet
    from app.sheets.requests import OutputColumn, RowTemplate, SheetSpec, request_lines
    from app.sheets.writing import added_columns, joined_rows, write_csv, write_xlsx

    columns = [OutputColumn("label", "one of", ["positive", "negative", "neutral"])]
    spec = SheetSpec(template="Label this review: {{ review }}", model="m", output_columns=columns)
    base = peak_mib()
    t0 = time.perf_counter()
    rows = 0
    if mode.startswith("read"):
        name = "sheet.csv" if mode == "read-csv" else "sheet.xlsx"
        with (
            open_sheet(folder / name, name)
            if not mode.endswith("calamine")
            else nullcontext(calamine_rows(folder / name)) as opened,
            open(folder / "input.jsonl", "wb") as out,
        ):
            template = RowTemplate(spec, opened.columns)
            for line in request_lines(template, opened.rows):
                out.write(line)
                rows += 1
    else:
        fmt = mode.split("-")[1]
        with (
            open_sheet(folder / "sheet.csv", "sheet.csv") as opened,
            open(folder / "output.jsonl", "rb") as output,
            open(folder / f"joined.{fmt}", "wb") as dest,
        ):
            header = [*opened.columns, *added_columns(columns)]

            def counted():
                nonlocal rows
                for row in joined_rows(opened.rows, output, iter(()), columns):
                    rows += 1
                    yield row

            if fmt == "csv":
                write_csv(dest, header, counted())
            else:
                write_xlsx(dest, header, counted(), "Reviews")
    return {
        "rows": rows,
        "seconds": time.perf_counter() - t0,
        "peak_mib": peak_mib(),
        "over_baseline_mib": peak_mib() - base,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        make_inputs(folder, args.rows)
        sizes = {n: (folder / n).stat().st_size / 2**20 for n in ("sheet.csv", "sheet.xlsx")}
        print(f"inputs: {args.rows:,} rows in {time.perf_counter() - t0:.1f} s; "
              f"CSV {sizes['sheet.csv']:.1f} MiB, XLSX {sizes['sheet.xlsx']:.1f} MiB")  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:  # interleaved, so that a busy moment falls on every mode
                done = subprocess.run(
                    [sys.executable, __file__, "--child", mode, "--dir", str(folder)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                results[mode].append(json.loads(done.stdout))
        med: dict[str, dict[str, float]] = {}
        print(f"{'mode':<20} {'rows':>8} {'seconds':>8} {'rows/s':>9} {'peak MiB':>9} {'+MiB':>7}")
        for mode, runs in results.items():
            runs.sort(key=lambda r: r["seconds"])
            m = med[mode] = runs[len(runs) // 2]
            print(f"{mode:<20} {m['rows']:>8,.0f} {m['seconds']:>8.2f} "
                  f"{m['rows'] / m['seconds']:>9,.0f} {m['peak_mib']:>9.1f} "
                  f"{m['over_baseline_mib']:>7.1f}")  # fmt: skip
        o, c = med["read-xlsx-openpyxl"], med["read-xlsx-calamine"]
        print(f"calamine/openpyxl reading XLSX: time {c['seconds'] / o['seconds']:.2f}x, "
              f"RSS over baseline {c['over_baseline_mib'] / max(o['over_baseline_mib'], 0.1):.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
