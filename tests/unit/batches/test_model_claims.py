"""Claims for the model pool: lines are claimed only for the models the pool feeds, the
runner tells the pool which models' lines wait, and the pool switches models when the
loaded one's queue is empty. Fake engines (one per loaded model, answering when the test
says) on a real SQLite file, the runner stepped by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.catalog import Entry
from app.config import Settings, bundled_model_path
from app.engine.node import EMBEDDED, lanes
from app.engine.pool import loading
from app.services import Services
from app.tables import BatchStatus
from tests.catalogs import entry
from tests.factories import batch_line
from tests.fakes import FakeLoads, HangingEngine, finish
from tests.unit.helpers import (
    MODEL_SETTINGS,
    batch,
    file_lines,
    hanging_lines,
    make_batch,
    pool_node,
    running,
)
from tests.waiting import until


def test_lines_wait_for_their_model_and_the_pool_switches_when_a_queue_empties(
    node: tuple[Services, FakeLoads], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, loads = node
    read: list[Path] = []
    monkeypatch.setattr(loading, "read_ahead", read.append)
    a = make_batch(svc, hanging_lines("a", 4, "a"))
    svc.runner.step()  # a runs before the others come (batches validated together share)
    unknown = make_batch(svc, hanging_lines("u", 2, "gpt-4o-mini"))  # a name nothing knows: a's
    b = make_batch(svc, hanging_lines("b", 4, "b-alias"))
    for _ in range(4):
        svc.runner.step()
    # Only "a" is loaded: its lane (the default's) takes its lines, then the unknown
    # name's, never b's; a's queue is not empty, so b waits.
    assert [lane.name for lane in svc.runner.pauses.open(lanes(svc.engine))] == [EMBEDDED]
    assert (running(svc, a), running(svc, unknown), running(svc, b)) == (4, 0, 0)
    first = loads.engines[0]
    assert finish(first) == 4
    svc.runner.step()
    assert running(svc, unknown) == 2 and running(svc, b) == 0
    # a's queue is empty now: it is fed no more, and unloaded once its lines are done.
    until(lambda: svc.engine.pool.active() == [], 10, "a to be drained")  # type: ignore[union-attr]
    assert loads.ids() == ["a"]
    # b's file is read into the page cache before its turn.
    until(lambda: bundled_model_path() in read, 5, "b's file read ahead")
    assert finish(first) == 2

    # Then b is loaded, and its lane claims.
    def b_runs() -> bool:
        svc.runner.step()
        return running(svc, b) == 4

    until(b_runs, 10, "b's lines to be claimed")
    assert loads.ids() == ["a", "b"]
    assert finish(loads.engines[1]) == 4
    for batch_id, model in ((a, "a"), (b, "b"), (unknown, "a")):
        until(
            lambda b=batch_id: svc.runner.step() or batch(svc, b).status == BatchStatus.COMPLETED,
            10,
        )
        out = file_lines(svc, batch(svc, batch_id).output_file_id)
        assert {line["response"]["body"]["model"] for line in out} == {model}
    views = {v.entry.id: v for v in svc.engine.pool.views()}  # type: ignore[union-attr]
    assert (views["a"].loads, views["b"].loads) == (1, 1)


def test_the_runner_tells_the_pool_which_lines_wait(node: tuple[Services, FakeLoads]) -> None:
    svc, loads = node
    a = make_batch(svc, hanging_lines("a", 6, "a"))
    make_batch(svc, hanging_lines("b", 3, "b"))
    for _ in range(4):
        svc.runner.step()
    assert running(svc, a) == 4
    views = {v.entry.id: v for v in svc.engine.pool.views()}  # type: ignore[union-attr]
    assert (views["a"].waiting, views["a"].in_flight, views["a"].state) == (2, 4, "loaded")
    assert (views["b"].waiting, views["b"].state) == (3, "on disk")
    assert loads.ids() == ["a"]


def test_a_model_that_fails_to_load_fails_its_own_lines_and_the_others_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = FakeLoads()

    def loader(s: Settings, e: Entry) -> HangingEngine:
        if e.id == "broken":
            raise RuntimeError(f"llama.cpp could not load {e.path}")
        return loads(s, e)

    svc, pool = pool_node(tmp_path, monkeypatch, loader, "broken")
    try:
        bad = make_batch(svc, [batch_line(f"x{i}", "hi", model="broken") for i in range(3)])
        good = make_batch(svc, [batch_line(f"a{i}", "hi", model="a") for i in range(3)])
        for batch_id in (bad, good):
            until(
                lambda b=batch_id: (
                    svc.runner.step() or batch(svc, b).status in BatchStatus.FINISHED
                ),
                20,
            )
        b, g = batch(svc, bad), batch(svc, good)
        assert (b.completed, b.failed, g.completed, g.failed) == (0, 3, 3, 0)
        errors = file_lines(svc, b.error_file_id)
        assert len(errors) == 3
        for line in errors:
            error = line["response"]["body"]["error"]
            assert error["code"] == "model_load_failed"
            assert (
                "The model 'broken' could not be loaded: RuntimeError: llama.cpp could not load"
                in error["message"]
            )
        assert {
            line["response"]["body"]["model"] for line in file_lines(svc, g.output_file_id)
        } == {"a"}
    finally:
        pool.close()


def test_a_default_lines_model_is_its_id_not_a_name_read_again(
    node: tuple[Services, FakeLoads],
) -> None:
    # A batch names a model nothing knows: routed to the default model ("a") at validation.
    # A model pulled meanwhile under that name does not take its lines: they reach the
    # engine as the default model's id, and run where they were claimed.
    svc, loads = node
    a = make_batch(svc, hanging_lines("a", 4, "a"))
    svc.runner.step()
    unknown = make_batch(svc, hanging_lines("u", 2, "llama9"))
    svc.runner.step()
    assert (running(svc, a), running(svc, unknown)) == (4, 0)  # a's lines fill the room
    assert batch(svc, unknown).route == ""
    catalog = svc.engine.pool.catalog  # type: ignore[union-attr]
    settings = Settings(**MODEL_SETTINGS, ctx_size=1024)
    catalog.put(entry("b", bundled_model_path(), settings, "b-alias", "llama9"))
    first = loads.engines[0]
    assert finish(first) == 4
    svc.runner.step()
    assert running(svc, unknown) == 2
    assert [body["model"] for body in first.hanging_bodies[4:]] == ["a", "a"]
    assert finish(first) == 2
    until(lambda: svc.runner.step() or batch(svc, unknown).status == BatchStatus.COMPLETED, 10)
    out = file_lines(svc, batch(svc, unknown).output_file_id)
    assert {line["response"]["body"]["model"] for line in out} == {"a"}
    assert loads.ids() == ["a"]
