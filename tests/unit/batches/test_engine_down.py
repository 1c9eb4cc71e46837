"""An engine that is down (EngineUnavailable) holds its lines: the runner puts each back in the
queue without using an attempt and claims nothing for the lane until the engine is up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from app.batches.claims import pauses
from app.engine.base import EngineUnavailable
from app.tables import RequestStatus
from tests.factories import batch_line
from tests.fakes import FakeEngine
from tests.unit.helpers import drive, make_batch, request_rows, services


class DownEngine(FakeEngine):
    """The fake engine, except that while `down` every request fails as a down upstream's."""

    down = True

    def answer(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.down:
            raise EngineUnavailable("The upstream engine 'up' could not be reached.")
        return super().answer(endpoint, body)


def test_lines_wait_for_a_down_engine_without_using_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pauses, "LANE_PAUSE_MIN", 0.3)
    eng = DownEngine(n_slots=2)
    svc = services(tmp_path, eng)
    bid = make_batch(svc, [batch_line(f"c{i}", f"q {i}") for i in range(6)])
    for _ in range(5):  # claims 4 (the lane's room), all come back unavailable
        svc.runner.step()
    assert len(eng.submitted) == 4  # the paused lane claimed nothing more
    rows = request_rows(svc, bid)
    assert all(r.status == RequestStatus.PENDING and r.attempts == 0 for r in rows)
    assert svc.runner.held == 0

    eng.down = False
    time.sleep(0.35)
    b = drive(svc, bid)
    assert (b.status, b.completed, b.failed) == ("completed", 6, 0)
    assert sorted(r.attempts for r in request_rows(svc, bid)) == [1] * 6
