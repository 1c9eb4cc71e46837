"""The one duration format (batches/throughput.py `duration`), as the dashboard and
`batchyard run`'s progress both show it."""

from __future__ import annotations

import io

from app.batches.throughput import duration
from app.offline import Progress


def test_a_duration_reads_as_a_person_reads_it() -> None:
    assert [duration(s) for s in (0, 4.2, 59.6, 95, 3599, 3725, 90061)] == [
        "0 s", "4 s", "1 min 00 s", "1 min 35 s", "59 min 59 s", "1 h 02 min", "25 h 01 min",
    ]  # fmt: skip
    assert duration(None) == "—"


def test_batchyard_runs_progress_shows_the_same_durations() -> None:
    out = io.StringIO()
    progress = Progress(out, done_before=0)
    progress.started -= 95  # 95 s in, a quarter done: 285 s to go
    progress.update(5, 20, 1.0)
    line = out.getvalue()
    assert f"ETA {duration(285)}" in line and f"elapsed {duration(95)}" in line
    out = io.StringIO()
    Progress(out, done_before=0).update(0, 20, 0.0)  # nothing done yet: no estimate
    assert f"ETA {duration(None)}" in out.getvalue()
