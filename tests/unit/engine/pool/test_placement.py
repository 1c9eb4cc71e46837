"""Placement: the budget, the reservations in it, and which idle models make room."""

from __future__ import annotations

from app.engine.pool.placement import Placement

MiB = 1 << 20


def test_a_reservation_is_the_estimate_then_the_measured_size() -> None:
    p = Placement(1000 * MiB)
    p.reserve("a", 300 * MiB)
    assert p.reserved() == 300 * MiB and p.fits(700 * MiB) and not p.fits(701 * MiB)
    p.measured("a", 420 * MiB)
    assert p.reservations["a"].measured and p.free() == 580 * MiB
    p.release("a")
    assert p.reserved() == 0


def test_victims_are_the_least_recently_used_with_nothing_in_flight() -> None:
    p = Placement(1000 * MiB)
    for name, used in (("old", 1.0), ("busy", 0.5), ("new", 3.0), ("mid", 2.0)):
        p.reserve(name, 250 * MiB, now=used)
    p.set_in_flight("busy", 2)
    assert p.victims(0) == []  # it fits already
    assert p.victims(100 * MiB) == ["old"]
    assert p.victims(300 * MiB) == ["old", "mid"]
    assert p.victims(750 * MiB) == ["old", "mid", "new"]
    # The busy model is never a victim, even when nothing else makes the room.
    assert p.victims(800 * MiB) is None
    p.touch("old", 4.0)
    assert p.victims(100 * MiB) == ["mid"]


def test_a_pinned_model_is_never_a_victim() -> None:
    p = Placement(500 * MiB)
    p.reserve("default", 250 * MiB, now=0.0)
    p.reservations["default"].pinned = True
    p.reserve("other", 250 * MiB, now=5.0)
    assert p.victims(200 * MiB) == ["other"]
