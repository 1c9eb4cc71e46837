"""The plan: which models are fed, loaded, drained and unloaded, step by step, on a fake
clock. Each step gives the plan what every model looks like now, as the pool would."""

from __future__ import annotations

from dataclasses import replace

from app.engine.pool.plan import FAILED, LOADED, LOADING, ON_DISK, BerthState, Plan

MiB = 1 << 20
SWITCH, TTL = 300.0, 600.0


def plan(budget: int = 1000 * MiB, max_loaded: int = 1) -> Plan:
    return Plan(budget=budget, max_loaded=max_loaded, switch_after=SWITCH, ttl=TTL)


def loaded(m: BerthState, now: float = 0.0) -> BerthState:
    """What the pool tells the plan once a load it decided is done: loaded, its bytes held."""
    return replace(m, state=LOADED, last_used=now, reserved=m.need)


def unloaded(m: BerthState) -> BerthState:
    return replace(m, state=ON_DISK, in_flight=0, reserved=0)


def test_a_loaded_model_is_fed_and_another_waits_while_its_queue_is_not_empty() -> None:
    p = plan()
    a = loaded(BerthState("a", 100 * MiB, waiting=50, oldest=0.0))
    b = BerthState("b", 100 * MiB, waiting=10, oldest=1.0)
    d = p.step(10.0, [a, b])
    assert d.active == {"a"} and d.load == () and not d.unload and not d.drain
    # Before the switch bound, b still waits while a has lines.
    d = p.step(1.0 + SWITCH - 1, [a, b])
    assert d.active == {"a"} and d.load == ()


def test_the_switch_waits_for_the_displaced_models_lines_in_flight() -> None:
    p = plan()
    a = loaded(BerthState("a", 100 * MiB, waiting=0, in_flight=3))
    b = BerthState("b", 100 * MiB, waiting=10, oldest=1.0)
    # a's queue is empty: it is drained (fed no more), b's file is read ahead.
    d = p.step(2.0, [a, b])
    assert d.active == frozenset() and d.drain == {"a"} and d.prefetch == "b"
    assert d.load == () and not d.unload  # never unloaded with lines in flight
    # New lines for a meanwhile do not bring it back: it finishes what it runs.
    a = replace(a, waiting=5, oldest=3.0, in_flight=1)
    d = p.step(3.0, [a, b])
    assert d.active == frozenset() and d.load == () and not d.unload
    a = replace(a, in_flight=0)
    d = p.step(4.0, [a, b])
    assert d.unload == ("a",) and d.load == ("b",)


def test_an_overdue_line_displaces_a_busy_model() -> None:
    p = plan()
    a = loaded(BerthState("a", 100 * MiB, waiting=500, oldest=0.0, in_flight=4))
    b = BerthState("b", 100 * MiB, waiting=1, oldest=10.0)
    assert p.step(0.0, [a]).active == {"a"}
    assert p.step(10.0 + SWITCH - 0.5, [a, b]).active == {"a"}
    d = p.step(10.0 + SWITCH, [a, b])
    assert d.drain == {"a"} and d.active == frozenset() and d.prefetch == "b"
    d = p.step(10.0 + SWITCH + 1, [replace(a, in_flight=0), b])
    assert d.unload == ("a",) and d.load == ("b",)


def test_room_for_both_loads_at_once_and_keeps_feeding() -> None:
    p = plan(max_loaded=2)
    a = loaded(BerthState("a", 100 * MiB, waiting=50, oldest=0.0, in_flight=4))
    b = BerthState("b", 100 * MiB, waiting=1, oldest=1.0)
    d = p.step(1.0, [a, b])
    assert d.load == ("b",) and d.active == {"a"} and not d.unload
    b = loaded(b, 1.0)
    assert p.step(2.0, [a, b]).active == {"a", "b"}


def test_memory_bounds_the_models_as_the_count_does() -> None:
    p = plan(budget=250 * MiB, max_loaded=0)
    a = loaded(BerthState("a", 150 * MiB, waiting=5, oldest=0.0, in_flight=1))
    b = BerthState("b", 150 * MiB, waiting=1, oldest=1.0)
    small = BerthState("small", 50 * MiB, waiting=1, oldest=2.0)
    d = p.step(3.0, [a, b, small])
    # b does not fit beside a (and a's queue is not empty); the small one does.
    assert d.load == ("small",) and d.active == {"a"}


def test_one_load_at_a_time_where_the_budget_holds_not_all() -> None:
    p = plan(budget=250 * MiB, max_loaded=0)
    a = BerthState("a", 100 * MiB, waiting=1, oldest=0.0, state=LOADING, reserved=100 * MiB)
    b = BerthState("b", 100 * MiB, waiting=1, oldest=1.0)
    c = BerthState("c", 100 * MiB, waiting=1, oldest=2.0)
    assert p.step(1.0, [a, b, c]).load == ()
    d = p.step(2.0, [loaded(replace(a, state=ON_DISK)), b, c])
    assert d.load == ("b",) and d.prefetch == "c"


def test_the_oldest_waiting_model_loads_first() -> None:
    p = plan()
    b = BerthState("b", 100 * MiB, waiting=9, oldest=5.0)
    c = BerthState("c", 100 * MiB, waiting=1, oldest=2.0)
    assert p.step(6.0, [b, c]).load == ("c",)


def test_idle_queues_are_displaced_before_busy_ones_then_least_recently_used() -> None:
    # Three loaded at a bound of two (as after a dashboard load): d needs two to make way.
    p = plan(max_loaded=2)
    a = loaded(BerthState("a", 100 * MiB, waiting=5, oldest=0.0, in_flight=1), now=1.0)
    b = loaded(BerthState("b", 100 * MiB), now=5.0)
    c = loaded(BerthState("c", 100 * MiB), now=3.0)
    d = BerthState("d", 100 * MiB, waiting=1, oldest=6.0)
    step = p.step(7.0, [a, b, c, d])
    # Without overdue lines a busy queue stays: the idle ones go, least recently used first.
    assert step.unload == ("c", "b") and step.load == ("d",) and step.active == {"a"}


def test_an_idle_model_is_unloaded_after_the_ttl_unless_pinned() -> None:
    p = plan(max_loaded=0)
    a = loaded(BerthState("a", 100 * MiB), now=0.0)
    pinned = loaded(BerthState("default", 100 * MiB, pinned=True), now=0.0)
    assert p.step(TTL - 1, [a, pinned]).unload == ()
    assert p.step(TTL, [a, pinned]).unload == ("a",)
    busy = replace(a, in_flight=1)
    assert p.step(TTL * 2, [busy, pinned]).unload == ()


def test_a_failed_model_is_active_so_its_lines_fail_and_is_never_loaded_again() -> None:
    p = plan()
    bad = BerthState("bad", 100 * MiB, waiting=3, oldest=0.0, state=FAILED)
    d = p.step(1.0, [bad])
    assert d.active == {"bad"} and d.load == ()


def test_a_model_too_big_for_the_budget_displaces_nothing() -> None:
    p = plan(budget=200 * MiB, max_loaded=0)
    a = loaded(BerthState("a", 100 * MiB), now=SWITCH * 2 - 1)  # within its TTL
    huge = BerthState("huge", 300 * MiB, waiting=1, oldest=0.0)
    d = p.step(SWITCH * 2, [a, huge])
    assert d.load == () and not d.unload and d.active == {"a"}


def test_three_models_one_slot_each_loads_once_while_queues_drain() -> None:
    """Three batches at once, one model at a time: each model loads once, in the order
    their lines began to wait, and none is unloaded with lines in flight."""
    p = plan()
    models = {m: BerthState(m, 100 * MiB, waiting=24, oldest=float(i)) for i, m in enumerate("abc")}
    loads: list[str] = []
    now = 10.0
    for _ in range(200):
        d = p.step(now, list(models.values()))
        for m in d.unload:
            assert models[m].in_flight == 0
            models[m] = unloaded(models[m])
        for m in d.load:
            loads.append(m)
            models[m] = loaded(models[m], now)
        for m in d.active:  # claim 4 lines, finish those in flight
            cur = models[m]
            take = min(4, cur.waiting)
            models[m] = replace(cur, waiting=cur.waiting - take, in_flight=take)
        for m, cur in models.items():
            if m not in d.active and cur.in_flight:
                models[m] = replace(cur, in_flight=0)
        if all(not m.waiting and not m.in_flight for m in models.values()):
            break
        now += 1.0
    assert loads == ["a", "b", "c"]
    assert all(not m.waiting for m in models.values())


def test_two_big_queues_take_turns_of_the_switch_bound_not_a_swap_per_step() -> None:
    """Both batches began at 0. Once b displaces a, a's lines wait from the moment it
    stopped being fed: it comes back after another switch bound, not at once."""
    p = plan()
    a = loaded(BerthState("a", 100 * MiB, waiting=1000, oldest=0.0, in_flight=2))
    b = BerthState("b", 100 * MiB, waiting=1000, oldest=0.0)
    assert p.step(0.0, [a, b]).active == {"a"}
    assert p.step(SWITCH - 1, [a, b]).active == {"a"}
    assert p.step(SWITCH, [a, b]).drain == {"a"}
    d = p.step(SWITCH + 1, [replace(a, in_flight=0), b])
    assert d.unload == ("a",) and d.load == ("b",)
    a, b = unloaded(a), loaded(b, SWITCH + 1)
    b = replace(b, in_flight=2)
    assert p.step(SWITCH + 2, [a, b]).active == {"b"}
    # a was last fed at SWITCH - 1: its lines count as waiting from then; b has been fed
    # since SWITCH + 2, and keeps its turn until SWITCH later.
    assert p.step(2 * SWITCH - 1, [a, b]).active == {"b"}
    assert p.step(2 * SWITCH + 1, [a, b]).active == {"b"}
    assert p.step(2 * SWITCH + 2, [a, b]).drain == {"b"}


def test_a_load_slower_than_the_switch_bound_does_not_swap_the_model_out_unused() -> None:
    """b loaded for an overdue line; a's lines are overdue too by the time b is loaded. b
    still gets its turn: its waiting line is sent before anything displaces it."""
    p = plan()
    a = BerthState("a", 100 * MiB, waiting=10, oldest=0.0)
    b = loaded(BerthState("b", 100 * MiB, waiting=1, oldest=5.0), now=2 * SWITCH)
    d = p.step(2 * SWITCH, [a, b])
    assert d.active == {"b"} and d.load == () and not d.unload and not d.drain
    # Its line sent, b's queue is empty: a's turn, once that line is done.
    d = p.step(2 * SWITCH + 1, [a, replace(b, waiting=0, in_flight=1)])
    assert d.drain == {"b"} and not d.unload and d.prefetch == "a"


def test_the_next_model_in_line_is_read_ahead() -> None:
    p = plan()
    a = loaded(BerthState("a", 100 * MiB, waiting=50, oldest=0.0, in_flight=4))
    b = BerthState("b", 100 * MiB, waiting=10, oldest=1.0)
    c = BerthState("c", 100 * MiB, waiting=10, oldest=2.0)
    # a's queue is not empty: nothing loads, and b, waiting longest, is read ahead.
    d = p.step(3.0, [a, b, c])
    assert d.load == () and d.prefetch == "b"
    # With room for one more, b loads and c, next in line, is read ahead meanwhile.
    p = plan(max_loaded=2)
    d = p.step(4.0, [a, b, c])
    assert d.load == ("b",) and d.prefetch == "c"


def test_where_the_budget_holds_every_waiting_model_they_load_side_by_side() -> None:
    p = plan(budget=400 * MiB, max_loaded=0)
    a = loaded(BerthState("a", 100 * MiB, waiting=5, oldest=0.0, in_flight=2))
    b = BerthState("b", 100 * MiB, waiting=3, oldest=2.0)
    c = BerthState("c", 150 * MiB, waiting=3, oldest=1.0)
    d = p.step(3.0, [a, b, c])
    # Both fit beside a: both load now, the longest waiting first; a is still fed.
    assert d.load == ("c", "b") and d.active == {"a"} and d.prefetch is None
    # While they load, a model that fits beside them all joins them; one that does not
    # waits until nothing is loading.
    b = replace(b, state=LOADING, reserved=b.need)
    c = replace(c, state=LOADING, reserved=c.need)
    e = BerthState("e", 10 * MiB, waiting=1, oldest=3.5)
    assert p.step(4.0, [a, b, c, e]).load == ("e",)
    e = replace(e, state=LOADING, reserved=e.need)
    f = BerthState("f", 100 * MiB, waiting=1, oldest=4.5)
    assert p.step(5.0, [a, b, c, e, f]).load == ()
    assert p.step(6.0, [a, loaded(b, 5.0), c, loaded(e), f]).load == ()
    # Once nothing is loading, f displaces a model whose queue is empty.
    idle = replace(loaded(b, 5.0), waiting=0)
    d = p.step(7.0, [a, idle, loaded(c, 6.0), loaded(e), f])
    assert d.load == ("f",) and d.unload == ("b",)


def test_where_the_budget_is_short_the_loads_go_one_at_a_time() -> None:
    # The bytes hold a beside b or c, not both: b (waiting longest) loads, c is read ahead.
    p = plan(budget=350 * MiB, max_loaded=0)
    a = loaded(BerthState("a", 100 * MiB, waiting=5, oldest=0.0, in_flight=2))
    b = BerthState("b", 150 * MiB, waiting=3, oldest=1.0)
    c = BerthState("c", 150 * MiB, waiting=3, oldest=2.0)
    d = p.step(3.0, [a, b, c])
    assert d.load == ("b",) and d.prefetch == "c"
    # The count bounds them as the bytes do.
    p = plan(max_loaded=2)
    d = p.step(3.0, [a, replace(b, need=10 * MiB), replace(c, need=10 * MiB)])
    assert d.load == ("b",) and d.prefetch == "c"


def test_the_dashboards_unload_waits_for_nothing_in_flight() -> None:
    p = plan(max_loaded=0)
    a = loaded(BerthState("a", 100 * MiB, waiting=5, oldest=0.0))
    assert p.step(1.0, [replace(a, evict=True, in_flight=1)]).unload == ()
    d = p.step(2.0, [replace(a, evict=True)])
    assert d.unload == ("a",) and d.active == frozenset()
