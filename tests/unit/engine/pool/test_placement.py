"""Placement: the budget, and the reservations in it from a load's estimate to its
measured size."""

from __future__ import annotations

from app.engine.pool.placement import Placement

MiB = 1 << 20


def test_a_reservation_is_the_estimate_then_the_measured_size() -> None:
    p = Placement(1000 * MiB)
    p.reserve("a", 300 * MiB)
    assert p.reserved() == p.held("a") == 300 * MiB and p.held("b") == 0
    p.measured("a", 420 * MiB)
    assert p.reservations["a"].measured and p.reserved() == 420 * MiB
    p.measured("b", 1)  # a model released meanwhile: nothing to measure
    p.release("a")
    assert p.reserved() == 0 and p.held("a") == 0
