"""The upstream engine in this process against the fleet's real upstream `batchyard serve`,
through a double that is overloaded on cue: the AIMD window, online before batch, cancel."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import wait

import pytest

from app.config.upstreams import parse_engine_spec
from app.engine.base import Priority, RequestCancelled
from app.engine.upstream.engine import UpstreamEngine
from app.wire.endpoints import CHAT
from tests.factories import chat_body
from tests.upstream_double import UPSTREAM_MODEL, FlakyUpstream, Fleet
from tests.waiting import until


@pytest.fixture
def double(fleet: Fleet) -> Iterator[FlakyUpstream]:
    d = FlakyUpstream(fleet.upstream.url)
    yield d
    d.close()


def engine_for(double: FlakyUpstream, options: str) -> UpstreamEngine:
    engine = UpstreamEngine(parse_engine_spec(f"t=openai:{double.api},{options}"))
    engine.start()
    return engine


def said(arrival_body: bytes) -> str:
    return str(json.loads(arrival_body)["messages"][-1]["content"])


def test_the_window_halves_on_429_and_grows_back_to_its_slots(double: FlakyUpstream) -> None:
    engine = engine_for(double, "concurrency=4,retries=6")
    try:
        double.hold = 0.3
        double.plan(*["429:1"] * 4)
        futures = [
            engine.submit(
                CHAT,
                chat_body(f"n{i}", model=UPSTREAM_MODEL, max_tokens=2),
                priority=Priority.BATCH,
            )
            for i in range(16)
        ]
        done, _ = wait(futures, timeout=120)
        assert len(done) == 16 and all(f.exception() is None for f in futures)
        arrivals = double.arrivals
        assert [a.answer for a in arrivals[:4]] == ["429:1"] * 4
        assert max(a.in_flight for a in arrivals[:4]) == 4  # it filled its slots at first
        after = arrivals[4:]
        assert len(after) == 16 and {a.answer for a in after} == {"forward"}
        assert after[0].at - arrivals[0].at >= 0.9  # Retry-After: 1 paused new requests
        assert max(a.in_flight for a in after[:4]) <= 2  # halved once, not four times
        assert max(a.in_flight for a in after) == 4  # and grew back to its slots
        status = engine.status()
        assert status.window == 4 and status.throttled_total == 4 and status.retries_total == 4
    finally:
        engine.close()


def test_online_requests_go_ahead_of_queued_batch_lines(double: FlakyUpstream) -> None:
    engine = engine_for(double, "concurrency=1")
    try:
        double.hold = 0.3
        double.plan()
        batch = [
            engine.submit(
                CHAT,
                chat_body(f"batch {i}", model=UPSTREAM_MODEL, max_tokens=2),
                priority=Priority.BATCH,
            )
            for i in range(3)
        ]
        time.sleep(0.1)  # the first batch line is out; the others wait for the one slot
        online = engine.submit(CHAT, chat_body("online", model=UPSTREAM_MODEL, max_tokens=2))
        wait([*batch, online], timeout=60)
        order = [said(a.body) for a in double.arrivals]
        assert order == ["batch 0", "online", "batch 1", "batch 2"]
        assert online.result()["model"] == UPSTREAM_MODEL
    finally:
        engine.close()


def test_cancel_drops_a_queued_request_and_aborts_a_running_one(double: FlakyUpstream) -> None:
    engine = engine_for(double, "concurrency=1")
    try:
        double.hold = 2.0
        double.plan()
        running = engine.submit(CHAT, chat_body("first", model=UPSTREAM_MODEL, max_tokens=2))
        queued = engine.submit(CHAT, chat_body("second", model=UPSTREAM_MODEL, max_tokens=2))
        time.sleep(0.3)
        assert engine.stats().active_slots == 1 and engine.stats().queue_depth == 1
        engine.cancel(queued)
        engine.cancel(running)
        for fut in (queued, running):
            with pytest.raises(RequestCancelled):
                fut.result(timeout=1)
        until(lambda: engine.stats().active_slots == 0, 5, "the slot to be free")
        stats = engine.stats()
        assert stats.active_slots == 0 and stats.queue_depth == 0
        assert stats.requests_total == {"cancelled": 2}
        time.sleep(2.5)
        assert [said(a.body) for a in double.arrivals] == ["first"]  # the queued one never went
    finally:
        engine.close()


def test_cancel_during_a_backoff_ends_it_at_once(double: FlakyUpstream) -> None:
    engine = engine_for(double, "concurrency=1,retries=6,backoff=0.25")
    try:
        double.plan(*["500"] * 7)
        fut = engine.submit(CHAT, chat_body("Hi", model=UPSTREAM_MODEL, max_tokens=2))

        def retries() -> int:
            assert not fut.done(), fut.result()
            return engine.status().retries_total

        # After the third retry it waits 1 s (0.25 s doubled twice) for its fourth try.
        until(retries, 10, "3 retries", accept=lambda n: n >= 3)
        assert engine.stats().queue_depth == 1
        engine.cancel(fut)
        with pytest.raises(RequestCancelled):
            fut.result(timeout=1)
        # ...at once, not when the 1 s would have passed.
        until(lambda: engine.stats().queue_depth == 0, 0.5, "the cancelled request to leave")
        assert engine.stats().active_slots == 0
        time.sleep(1.5)  # past the fourth try's time: it would show
        assert len(double.arrivals) == 3 and engine.status().retries_total == 3
    finally:
        engine.close()
