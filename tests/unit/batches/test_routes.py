"""One name, one route: a batch's model is read once, at validation, into the id of the model
that runs it, and its lines are answered by that model or by none.

A node whose pool holds the default model "a" and "b" (alias "b-alias"), one loaded at a time,
with fake engines that answer when the test says, on a real SQLite file; and two nodes' names
on one database (the second only publishing, as a node that holds "c" would).
"""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import col

from app.batches.nodes import NodeNames, unserved_lines
from app.services import Services
from app.tables import Batch, BatchStatus
from app.telemetry import unserved_by_model
from tests.fakes import FakeLoads, finish
from tests.unit.helpers import batch, file_lines, hanging_lines, make_batch, running
from tests.waiting import until


def step_until(svc: Services, done: object, timeout: float = 20) -> None:
    until(lambda: svc.runner.step() or done(), timeout)  # type: ignore[operator]


def answered_by(svc: Services, batch_id: str) -> set[str]:
    return {
        line["response"]["body"]["model"]
        for line in file_lines(svc, batch(svc, batch_id).output_file_id)
    }


def test_names_in_any_letter_case_run_on_their_model(node: tuple[Services, FakeLoads]) -> None:
    svc, loads = node
    made = {name: make_batch(svc, hanging_lines(name, 2, name)) for name in ("B", "B-ALIAS", "A")}
    for _ in range(3):
        svc.runner.step()
    assert {name: batch(svc, b).route for name, b in made.items()} == {
        "B": "b",
        "B-ALIAS": "b",
        "A": "a",
    }
    for name, batch_id in made.items():

        def done(b: str = batch_id) -> bool:
            for engine in loads.engines:
                finish(engine)
            return batch(svc, b).status == BatchStatus.COMPLETED

        step_until(svc, done)
        assert answered_by(svc, batch_id) == {name.lower().removesuffix("-alias")}
    # b was loaded once, for both of its batches.
    assert loads.ids().count("b") == 1


def test_a_model_no_live_node_serves_waits_and_never_falls_to_the_default(
    node: tuple[Services, FakeLoads],
) -> None:
    svc, loads = node
    other = NodeNames(svc.db, "node-c", lambda: {"c": "c", "c:q4": "c"}, lease_seconds=30)
    other.beat()  # a node holding "c" publishes its names
    waiting = make_batch(svc, hanging_lines("c", 3, "C:Q4"))
    unknown = make_batch(svc, hanging_lines("u", 2, "gpt-4o-mini"))  # nothing knows it
    for _ in range(3):
        svc.runner.step()
    assert (batch(svc, waiting).route, batch(svc, unknown).route) == ("c", "")
    # The node holding "c" stops: its lines wait, counted, while the default runs on.
    other.withdraw()

    def unknown_done() -> bool:
        for engine in loads.engines:
            finish(engine)
        return batch(svc, unknown).status == BatchStatus.COMPLETED

    step_until(svc, unknown_done)
    assert answered_by(svc, unknown) == {"a"}
    for _ in range(5):
        svc.runner.step()
    assert running(svc, waiting) == 0 and batch(svc, waiting).completed == 0
    assert batch(svc, waiting).status == BatchStatus.IN_PROGRESS
    with svc.db.read() as s:
        assert unserved_lines(s) == {waiting: {"c": 3}}
    assert unserved_by_model(svc.db) == {"c": 3}
    assert loads.ids() == ["a"]  # nothing was loaded for them here
    # Back again: served, though still not by this node.
    other.beat()
    with svc.db.read() as s:
        assert unserved_lines(s) == {}


def test_a_batch_validated_before_routes_gets_its_route_at_the_next_start(
    node: tuple[Services, FakeLoads],
) -> None:
    svc, loads = node
    old = make_batch(svc, hanging_lines("o", 2, "B-Alias"))
    svc.runner.step()  # validated
    with svc.db.write() as s:  # as revision 0008 leaves a batch from before it
        s.exec(update(Batch).where(col(Batch.id) == old).values(route=None))
    for _ in range(3):
        svc.runner.step()
    assert running(svc, old) == 0  # no lane takes a batch without a route
    svc.runner._routed_old = False  # as a node starting again
    svc.runner.step()
    assert batch(svc, old).route == "b"

    def done() -> bool:
        for engine in loads.engines:
            finish(engine)
        return batch(svc, old).status == BatchStatus.COMPLETED

    step_until(svc, done)
    assert answered_by(svc, old) == {"b"}
