"""`batchyard run`: file in, output file out, on the real engine and the real default model."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from app.offline import Progress
from tests.factories import CHAT, batch_line, jsonl, jsonl_lines, jsonl_texts
from tests.live import batchyard, start_batchyard
from tests.waiting import until

# Two slots of 256 tokens: enough for these lines, quick to load.
SMALL = ("--parallel", "2", "--ctx-size", "256")


def run_to_end(*args: str) -> tuple[int, str]:
    done = batchyard(*args, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_run_writes_one_output_line_per_input_line(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    lines = [
        batch_line(f"req-{i}", text, max_tokens=8)
        for i, text in enumerate(["Say hi", "Count to 3", "Name a colour"])
    ]
    # A prompt longer than the context fails on its own, as a line of the error file.
    lines.append(batch_line("too-long", "word " * 400, max_tokens=8))
    src.write_bytes(jsonl(*lines))
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"

    rc, log = run_to_end("run", str(src), "-o", str(out), "--errors", str(errors), *SMALL)

    assert rc == 3, log  # done, but one line failed
    results = jsonl_lines(out.read_text())
    assert [r["custom_id"] for r in results] == ["req-0", "req-1", "req-2"]
    for r in results:
        assert r["error"] is None
        assert r["response"]["status_code"] == 200
        body = r["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"]
        assert 0 < body["usage"]["completion_tokens"] <= 8
    failed = jsonl_lines(errors.read_text())
    assert [r["custom_id"] for r in failed] == ["too-long"]
    assert failed[0]["response"]["status_code"] == 400
    assert failed[0]["response"]["body"]["error"]["code"]
    # Not a terminal: plain progress lines, ending with all lines done.
    assert "progress: 4/4 lines (100%)" in log
    assert "3 lines succeeded, 1 failed" in log
    # The same throughput summary as the dashboard's chart.
    assert re.search(
        r"batchyard run: throughput: 4 of 4 lines in \d+ s · [\d.]+ tokens/s average", log
    ), log

    # `batchyard retry` on the run's state dir: a new batch of the failed line, linked both ways.
    state = tmp_path / "out.jsonl.batchyard-state"
    with sqlite3.connect(state / "batchyard.db") as db:
        ((batch_id, input_file_id),) = db.execute("select id, input_file_id from batch").fetchall()
    retried = batchyard("retry", batch_id, "--data-dir", str(state))
    assert retried.returncode == 0, retried.stderr
    new_id = retried.stdout.strip()
    assert new_id.startswith("batch_") and f"retry_of={batch_id}" in retried.stderr
    with sqlite3.connect(state / "batchyard.db") as db:
        meta = dict(db.execute("select id, metadata from batch").fetchall())
        (new_input,) = db.execute(
            "select input_file_id from batch where id = ?", (new_id,)
        ).fetchone()
    assert json.loads(meta[new_id]) == {"retry_of": batch_id}
    assert json.loads(meta[batch_id]) == {"retried_by": new_id}
    original = jsonl_texts((state / "files" / input_file_id).read_bytes())
    assert jsonl_texts((state / "files" / new_input).read_bytes()) == [original[3]]
    again = batchyard("retry", "batch_nope", "--data-dir", str(state))
    assert again.returncode == 1 and "batch_nope" in again.stderr


def test_run_reports_every_bad_line_and_exits_non_zero(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_bytes(
        jsonl(
            batch_line("ok-1", "hi", max_tokens=8),
            "{not json",
            {"method": "POST", "url": CHAT, "body": {"messages": []}},
            batch_line("ok-1", "duplicate id", max_tokens=8),
        )
    )
    out = tmp_path / "out.jsonl"

    rc, log = run_to_end("run", str(src), "-o", str(out))

    assert rc == 1, log
    assert "failed validation" in log
    for number in (2, 3, 4):
        assert f"line {number}:" in log, log
    assert "line 1:" not in log
    assert not out.exists()


def test_run_refuses_a_missing_input(tmp_path: Path) -> None:
    rc, log = run_to_end("run", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl"))
    assert rc == 2
    assert "no such file" in log


def _succeeded(db: Path) -> dict[str, str]:
    """custom_id -> request_id of every line recorded as succeeded so far."""
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute(
            "SELECT custom_id, request_id FROM request WHERE status = 'succeeded'"
        ).fetchall()
    except sqlite3.OperationalError:  # the tables are not there yet
        return {}
    finally:
        con.close()
    return dict(rows)


@pytest.mark.slow
def test_interrupted_run_resumes_without_redoing_lines(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    ids = [f"line-{i:02d}" for i in range(20)]
    # The first lines are short so that some finish early; the rest keep the run going.
    src.write_bytes(
        jsonl(
            *(
                batch_line(c, f"Write a word about the number {i}", max_tokens=4 if i < 3 else 16)
                for i, c in enumerate(ids)
            )
        )
    )
    out = tmp_path / "out.jsonl"
    db = tmp_path / "out.jsonl.batchyard-state" / "batchyard.db"
    args = ("run", str(src), "-o", str(out), *SMALL)

    proc = start_batchyard(*args)

    def succeeded() -> int:
        assert proc.poll() is None, proc.communicate()
        return len(_succeeded(db))

    until(succeeded, 240, "3 lines to succeed", accept=lambda n: n >= 3, poll=0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err
    before = _succeeded(db)
    assert 3 <= len(before) < 20, "the interrupt came too late to test resuming"
    assert not out.exists()

    # Without --resume the interrupted state is not thrown away.
    rc, log = run_to_end(*args)
    assert rc == 2 and "--resume" in log

    rc, log = run_to_end(*args, "--resume")
    assert rc == 0, log

    results = jsonl_lines(out.read_text())
    assert sorted(r["custom_id"] for r in results) == ids  # every line exactly once
    by_id = {r["custom_id"]: r for r in results}
    # Lines finished before the interrupt keep the result recorded then: not run again.
    for custom_id, request_id in before.items():
        assert by_id[custom_id]["response"]["request_id"] == request_id
    assert len(_succeeded(db)) == 20
    # The resumed run's progress starts from where the first one stopped.
    first = re.search(r"progress: (\d+)/20 lines", log)
    assert first and int(first.group(1)) >= len(before), log


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal_and_lines_otherwise() -> None:
    tty = _Terminal()
    bar = Progress(tty)
    bar.started -= 10  # ten seconds in
    bar.update(5, 20, 12.5)
    bar.update(20, 20, 0.0, final=True)
    text = tty.getvalue()
    assert text.startswith(
        "\r\x1b[2K[#######.....................] 5/20 lines (25%)  12.5 tok/s  ETA —"
    )
    assert text.endswith("20/20 lines (100%)  0.0 tok/s  ETA 0 s\n")

    plain = io.StringIO()
    lines = Progress(plain)
    lines.update(1, 4, 3.0)
    lines.update(2, 4, 3.0)  # within the interval: not printed
    lines.update(4, 4, 3.0, final=True)
    printed = plain.getvalue().splitlines()
    assert len(printed) == 2 and "\r" not in plain.getvalue()
    assert printed[0].startswith("progress: 1/4 lines (25%)  3.0 tok/s")
    assert printed[1].startswith("progress: 4/4 lines (100%)")


def test_progress_shows_the_projected_finish_and_a_deadline() -> None:
    tty = _Terminal()
    bar = Progress(tty)
    finish = time.time() + 90.4
    bar.update(5, 20, 12.5, finish_at=finish, deadline=finish + 3600)
    shown = time.strftime("%H:%M:%S", time.localtime(finish))
    late = time.strftime("%H:%M:%S", time.localtime(finish + 3600))
    assert tty.getvalue().endswith(f"ETA 1 min 30 s  finishes {shown}  deadline {late}")


def test_run_draws_a_progress_bar_when_stderr_is_a_terminal(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        jsonl(batch_line("t-1", "Hi", max_tokens=4), batch_line("t-2", "Yo", max_tokens=4))
    )
    primary, secondary = pty.openpty()
    args = ("run", str(src), "-o", str(tmp_path / "o.jsonl"), *SMALL)
    proc = start_batchyard(*args, stdout=subprocess.DEVNULL, stderr=secondary)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert proc.wait(120) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "\r\x1b[2K[" in text  # redrawn in place
    assert "] 2/2 lines (100%)" in text
    assert "progress:" not in text  # no plain lines on a terminal
