"""The one duration format (batches/throughput.py `duration`) and the one finish-time
estimate (batches/claims/projection.py `seconds_left`), as the batch list, the batch page's
summary and chart, and `batchyard run`'s progress all show them."""

from __future__ import annotations

import io
import time

from app.batches import throughput
from app.batches.claims.projection import Projection, seconds_left
from app.batches.throughput import duration
from app.offline import Progress
from app.tables import Batch, BatchStatus
from app.web import views


def test_a_duration_reads_as_a_person_reads_it() -> None:
    assert [duration(s) for s in (0, 4.2, 59.6, 95, 3599, 3725, 90061)] == [
        "0 s", "4 s", "1 min 00 s", "1 min 35 s", "59 min 59 s", "1 h 02 min", "25 h 01 min",
    ]  # fmt: skip
    assert duration(None) == "—"


def test_the_estimate_is_the_projection_and_nothing_else() -> None:
    assert seconds_left(1090.0, 1000.0, total=20, done=5) == 90.0
    assert seconds_left(990.0, 1000.0, total=20, done=5) == 0.0  # overdue: due now
    assert seconds_left(None, 1000.0, total=20, done=5) is None  # not projected yet
    assert seconds_left(None, 1000.0, total=20, done=20) == 0.0


def running_batch(now: float) -> Batch:
    return Batch(
        id="batch_1", owner="", endpoint="/v1/chat/completions", input_file_id="file-1",
        completion_window="24h", status=BatchStatus.IN_PROGRESS, total=200, completed=100,
        created_at=int(now) - 20, in_progress_at=int(now) - 10, expires_at=int(now) + 3600,
    )  # fmt: skip


def test_the_batch_page_shows_one_eta() -> None:
    now = time.time()
    batch = running_batch(now)
    series = [(int(now) - 10 + s, 10, 200) for s in range(10)]  # 10 lines a second
    # The lane is shared: the projection says 300 s, not the 10 s of this batch's own rate.
    projection = Projection(batch.id, now + 300, batch.expires_at, 1.0, 0.1, 0, now)
    row = views.batch_row(batch, None, now, projection)
    chart = views.throughput_chart(throughput.of_batch(batch, series, now, now + 300))
    assert row["eta"] == chart["eta"] == duration(300) and "ETA 5 min 00 s" in chart["summary"]
    # Before any projection, neither guesses.
    row = views.batch_row(batch, None, now, None)
    chart = views.throughput_chart(throughput.of_batch(batch, series, now))
    assert row["eta"] is None and chart["eta"] is None and "ETA" not in chart["summary"]


def test_batchyard_runs_progress_shows_the_same_estimate() -> None:
    out = io.StringIO()
    progress = Progress(out)
    progress.started -= 95
    progress.update(5, 20, 1.0, finish_at=time.time() + 285.2)
    line = out.getvalue()
    assert f"ETA {duration(285)}" in line and f"elapsed {duration(95)}" in line
    out = io.StringIO()
    Progress(out).update(5, 20, 1.0)  # not projected yet: no guess
    assert f"ETA {duration(None)}" in out.getvalue()
