"""The results explorer's service methods on a real SQLite file: pages, filters, search, one
line, what finished so far, the progress series and its chart, and retrying failed lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.batches import throughput
from app.errors import APIError
from app.services import Services
from app.tables import BatchStatus
from app.web import views
from tests.factories import batch_line, jsonl_lines, jsonl_texts
from tests.fakes import FakeEngine, HangingEngine
from tests.unit.helpers import batch, drive, file_lines, make_batch, services

N = 30


def lines(n: int = N) -> list[dict]:
    # Every 7th line fails in the fake engine ("FAIL" in its prompt).
    return [
        batch_line(f"row-{i}", ("FAIL " if i % 7 == 0 else "") + f"question {i}", max_tokens=4)
        for i in range(1, n + 1)
    ]


@pytest.fixture
def done(tmp_path: Path) -> tuple[Services, str]:
    svc = services(tmp_path, FakeEngine())
    batch_id = make_batch(svc, lines())
    assert drive(svc, batch_id).status == BatchStatus.COMPLETED
    return svc, batch_id


def test_pages_filters_and_search(done: tuple[Services, str]) -> None:
    svc, batch_id = done
    first = svc.batches.lines(batch_id, "", limit=10)
    assert [r.line for r in first.rows] == list(range(1, 11))
    assert first.has_more and first.next_after == 10
    seen = [r.line for r in first.rows]
    after = first.next_after
    while after is not None:
        page = svc.batches.lines(batch_id, "", limit=10, after=after)
        seen += [r.line for r in page.rows]
        after = page.next_after
    assert seen == list(range(1, N + 1))

    failed = svc.batches.lines(batch_id, "", status="failed")
    assert [r.custom_id for r in failed.rows] == ["row-7", "row-14", "row-21", "row-28"]
    ok = svc.batches.lines(batch_id, "", status="succeeded", limit=200)
    assert len(ok.rows) == N - 4 and not ok.has_more
    assert svc.batches.lines(batch_id, "", status="pending").rows == []
    assert svc.batches.line_counts(batch_id, "") == {
        "all": N, "succeeded": N - 4, "failed": 4, "pending": 0,
    }  # fmt: skip

    found = svc.batches.lines(batch_id, "", search="row-2")
    assert [r.custom_id for r in found.rows] == ["row-2"] + [f"row-{i}" for i in range(20, 30)]
    assert [r.custom_id for r in svc.batches.lines(batch_id, "", search="w-14").rows] == ["row-14"]
    # LIKE's wildcards are taken as text.
    assert svc.batches.lines(batch_id, "", search="row_1").rows == []
    assert svc.batches.lines(batch_id, "", search="%").rows == []

    for kwargs, param in (({"status": "bogus"}, "status"), ({"limit": 0}, "limit"),
                          ({"search": "x" * 513}, "q")):  # fmt: skip
        with pytest.raises(APIError) as err:
            svc.batches.lines(batch_id, "", **kwargs)  # type: ignore[arg-type]
        assert err.value.param == param and err.value.status_code == 400
    with pytest.raises(APIError) as err:
        svc.batches.lines(batch_id, "someone-else")
    assert err.value.status_code == 404


def test_one_line_shows_its_input_beside_the_answer_or_error(done: tuple[Services, str]) -> None:
    svc, batch_id = done
    ok = views.line_detail(svc.batches.line(batch_id, "", 3))
    assert ok["custom_id"] == "row-3" and ok["status"] == "succeeded"
    assert ok["messages"] == [{"role": "user", "text": "question 3"}]
    assert ok["answer"] == "echo: question 3" and ok["error"] is None
    assert '"max_tokens": 4' in ok["params"]
    bad = views.line_detail(svc.batches.line(batch_id, "", 7))
    assert bad["answer"] is None
    assert bad["error"]["code"] == "context_length_exceeded"
    with pytest.raises(APIError) as err:
        svc.batches.line(batch_id, "", N + 1)
    assert err.value.status_code == 404


def test_finished_output_is_what_the_files_hold(done: tuple[Services, str]) -> None:
    svc, batch_id = done
    b = batch(svc, batch_id)
    for kind, file_id in (("output", b.output_file_id), ("errors", b.error_file_id)):
        streamed = b"".join(svc.batches.finished_output(batch_id, "", kind))
        assert jsonl_lines(streamed) == file_lines(svc, file_id)
    with pytest.raises(APIError):
        svc.batches.finished_output(batch_id, "", "everything")


def test_a_running_batch_explores_and_downloads_what_finished(tmp_path: Path) -> None:
    svc = services(tmp_path, HangingEngine())
    data = lines(6)
    data[4]["body"]["messages"][0]["content"] = "HANG here"
    batch_id = make_batch(svc, data)
    for _ in range(50):
        svc.runner.step()
    b = batch(svc, batch_id)
    assert b.status == BatchStatus.IN_PROGRESS
    counts = svc.batches.line_counts(batch_id, "")
    assert counts == {"all": 6, "succeeded": 5, "failed": 0, "pending": 1}
    assert [r.custom_id for r in svc.batches.lines(batch_id, "", status="pending").rows] == [
        "row-5"
    ]
    so_far = jsonl_lines(b"".join(svc.batches.finished_output(batch_id, "", "output")))
    assert [x["custom_id"] for x in so_far] == [
        "row-1", "row-2", "row-3", "row-4", "row-6",
    ]  # fmt: skip
    assert views.line_detail(svc.batches.line(batch_id, "", 5))["status"] == "running"
    tp = throughput.of_batch(b, svc.batches.progress_series(batch_id, ""), b.created_at + 5)
    assert tp.done == 5 and tp.total == 6
    svc.runner.stop()


def test_progress_series_and_chart(done: tuple[Services, str]) -> None:
    svc, batch_id = done
    b = batch(svc, batch_id)
    series = svc.batches.progress_series(batch_id, "")
    assert sum(n for _, n, _ in series) == N
    # Fake completions are (words + 1) tokens long.
    assert sum(t for _, _, t in series) == b.output_tokens > 0
    tp = throughput.of_batch(b, series, b.created_at + 100)
    assert tp.done == N and tp.eta is None
    assert tp.buckets[-1].done == N
    chart = views.throughput_chart(tp)
    assert chart["line"].startswith(f"{views.PLOT_X0:.1f},{views.PLOT_Y1:.1f}")
    # The line ends at the top: every line is done.
    assert chart["line"].split()[-1].endswith(f",{views.PLOT_Y0:.1f}")
    assert f"{N} of {N} lines" in chart["summary"]


def test_throughput_buckets_rates_and_eta() -> None:
    # 10 lines a second for 10 seconds, 20 tokens each, of a 200-line batch still running,
    # projected to finish in 10 s.
    series = [(1000 + s, 10, 200) for s in range(10)]
    tp = throughput.throughput(
        series, total=200, started_at=1000, ended_at=None, now=1010, running=True, finish_at=1020
    )
    assert tp.done == 100 and tp.tokens == 2000
    assert tp.tokens_per_s == pytest.approx(200.0)
    assert tp.peak_tokens_per_s == pytest.approx(200.0)
    assert tp.eta == pytest.approx(10.0)
    assert "ETA 10 s" in throughput.summary(tp)
    assert len(tp.buckets) == 10
    assert [b.done for b in tp.buckets] == list(range(10, 101, 10))
    long = [(t, 1, 5) for t in range(0, 7200, 3)]
    tp = throughput.throughput(
        long, total=2400, started_at=0, ended_at=7200, now=9999, running=False
    )
    assert len(tp.buckets) == throughput.MAX_BUCKETS and tp.eta is None
    assert throughput.sparkline([0, 1, 2, 4]) == "▁▃▅█"
    report = throughput.report(tp)
    assert report[0].startswith("throughput: 2400 of 2400 lines in 2 h 00 min")


def test_retry_makes_a_batch_of_the_failed_lines_linked_both_ways(
    done: tuple[Services, str],
) -> None:
    svc, batch_id = done
    original = jsonl_texts(svc.storage.path(batch(svc, batch_id).input_file_id).read_bytes())
    new = svc.batches.retry(batch_id, "")
    assert json.loads(new.metadata_json or "{}") == {"retry_of": batch_id}
    assert json.loads(batch(svc, batch_id).metadata_json or "{}") == {"retried_by": new.id}
    retry_input = jsonl_texts(svc.storage.path(new.input_file_id).read_bytes())
    assert retry_input == [original[i - 1] for i in (7, 14, 21, 28)]  # the very bytes
    assert drive(svc, new.id).total == 4
    # A batch without failures, or still running, has nothing to retry.
    with pytest.raises(APIError) as err:
        svc.batches.retry(make_batch(svc, lines(3)), "")
    assert "only a completed" in err.value.message
    ok_id = make_batch(svc, lines(3))
    drive(svc, ok_id)
    with pytest.raises(APIError) as err:
        svc.batches.retry(ok_id, "")
    assert "no failed lines" in err.value.message
