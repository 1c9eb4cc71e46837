"""The queue's health in /metrics' text: lines waiting per engine and per owner, and the age
of each engine's oldest waiting line, counted in the database at scrape time."""

from __future__ import annotations

import time
from pathlib import Path

from app.telemetry import RequestMetrics, render
from tests.factories import batch_line
from tests.fakes import FakeEngine, HangingEngine
from tests.metrics import parse, value
from tests.unit.helpers import make_batch, services


def test_waiting_lines_by_engine_and_owner(tmp_path: Path) -> None:
    eng = HangingEngine(n_slots=1)  # room for 2 lines; HANG keeps them running
    svc = services(tmp_path, eng)
    make_batch(svc, [batch_line(f"a{i}", f"HANG {i}") for i in range(3)], owner="key-a")
    time.sleep(0.01)
    make_batch(svc, [batch_line(f"b{i}", f"q {i}") for i in range(2)], owner="key-b")

    def samples() -> list[tuple[str, dict[str, str], float]]:
        text = render(db=svc.db, engine=eng, requests=RequestMetrics())
        types, found = parse(text)
        assert types["batchyard_engine_pending_lines"] == "gauge"
        assert types["batchyard_owner_pending_lines"] == "gauge"
        assert types["batchyard_engine_oldest_pending_seconds"] == "gauge"
        return found

    s = samples()  # still validating: no line is waiting to be claimed yet
    assert value(s, "batchyard_engine_pending_lines", engine="embedded") == 0
    assert value(s, "batchyard_engine_oldest_pending_seconds", engine="embedded") == 0
    assert not [x for x in s if x[0] == "batchyard_owner_pending_lines"]

    svc.runner._validate_next()
    svc.runner._validate_next()
    s = samples()
    assert value(s, "batchyard_engine_pending_lines", engine="embedded") == 5
    assert value(s, "batchyard_owner_pending_lines", owner="key-a") == 3
    assert value(s, "batchyard_owner_pending_lines", owner="key-b") == 2
    age = value(s, "batchyard_engine_oldest_pending_seconds", engine="embedded")
    assert 0 < age < 30

    svc.runner._claim_and_submit()  # one line of each key runs (fair shares, claims.py)
    s = samples()
    assert value(s, "batchyard_engine_pending_lines", engine="embedded") == 3
    assert value(s, "batchyard_owner_pending_lines", owner="key-a") == 2
    assert value(s, "batchyard_owner_pending_lines", owner="key-b") == 1
    eng.close()


def test_no_engine_yet_shows_no_engine_rows(tmp_path: Path) -> None:
    svc = services(tmp_path, FakeEngine())
    text = render(db=svc.db, engine=None, requests=RequestMetrics())
    _, s = parse(text)
    assert not [x for x in s if x[0] == "batchyard_engine_pending_lines"]
