"""A client that gives up on an online request before its answer withdraws it: an upstream's
retries stop at once (a whole answer, or a stream still waiting for its first chunk) and an
embedded slot is freed. The fleet's real front `batchyard serve`, real disconnects (an httpx
client whose read timeout runs out), and the figures from its /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.factories import chat_body
from tests.metrics import scrape, value
from tests.upstream_double import FLAKY_BACKOFF_S, FLAKY_MODEL, Fleet
from tests.waiting import until

EMBEDDED_MODEL = "SmolLM2-135M-Instruct.Q4_1"
#: SmolLM2's end-of-text, im_start and im_end tokens: banned, the model writes to max_tokens.
NO_END = {"0": -100, "1": -100, "2": -100}


def outcome(samples: list, name: str) -> float:
    """Requests every engine finished with outcome `name` (0 before the first)."""
    found = [
        v
        for n, lab, v in samples
        if n == "batchyard_engine_requests_total" and lab.get("outcome") == name
    ]
    return sum(found)


def cancelled(samples: list) -> float:
    return outcome(samples, "cancelled")


def settles(check: Callable[[list], bool], fleet: Fleet, within: float) -> list:
    """Poll /metrics until `check` holds (its samples returned), or fail with the last ones."""
    last: list = []

    def scraped() -> list:
        last[:] = scrape(fleet.front.url)
        return last

    try:
        return list(until(scraped, within, "/metrics to settle", accept=check, poll=0.1))
    except AssertionError:
        engine = [s for s in last if "engine" in s[0]]  # the samples that matter here
        raise AssertionError(f"/metrics did not settle in {within}s: {engine}") from None


def give_up(fleet: Fleet, path: str, body: dict, after: float) -> None:
    """POST `body` and hang up when no answer came within `after` seconds."""
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.Client(timeout=httpx.Timeout(30, read=after)) as client,
    ):
        client.post(fleet.front.api + path, json=body)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed-before-a-chunk"])
def test_a_client_that_gives_up_stops_an_upstreams_retries(fleet: Fleet, stream: bool) -> None:
    before = scrape(fleet.front.url)
    retries_before = value(before, "batchyard_upstream_retries_total", engine="flaky")
    # Every try fails as a dead upstream does (the connection closes unanswered); `flaky`
    # has retries=4, 0.2, 0.4, 0.8 and 1.6 s apart: 3 s of retrying if nobody stops it.
    fleet.double.plan(*["drop"] * 5)
    try:
        body = chat_body("Hi", model=FLAKY_MODEL, max_tokens=3, stream=stream)
        give_up(fleet, "/chat/completions", body, 1.2)
        after = settles(
            lambda s: (
                value(s, "batchyard_engine_in_flight", engine="flaky") == 0
                and value(s, "batchyard_engine_queue_depth", engine="flaky") == 0
                and cancelled(s) == cancelled(before) + 1
            ),
            fleet,
            within=5,
        )
        tries = len(fleet.double.arrivals)
        retries = value(after, "batchyard_upstream_retries_total", engine="flaky")
        assert 1 <= tries < 5
        # Each failed try but the last was retried; the last one's retry may have been
        # scheduled when the client went, and never ran.
        assert retries - retries_before in (tries - 1, tries)
        # Past the backoff the last try's retry had (FLAKY_BACKOFF_S after the first,
        # doubling each time), and a second more: a retry still scheduled would show.
        retry_at = fleet.double.arrivals[-1].at + FLAKY_BACKOFF_S * 2 ** (tries - 1)
        time.sleep(max(0.0, retry_at + 1.0 - time.monotonic()))
        assert len(fleet.double.arrivals) == tries
        later = scrape(fleet.front.url)
        assert value(later, "batchyard_upstream_retries_total", engine="flaky") == retries
        assert value(later, "batchyard_engine_errors_total", engine="flaky") == value(
            before, "batchyard_engine_errors_total", engine="flaky"
        )  # withdrawn, not failed after its tries
    finally:
        fleet.double.plan()


def test_a_client_that_gives_up_frees_its_embedded_slot(fleet: Fleet) -> None:
    before = scrape(fleet.front.url)
    body = {"model": EMBEDDED_MODEL, "prompt": "Once upon a time", "max_tokens": 1000}
    give_up(fleet, "/completions", {**body, "logit_bias": NO_END}, 1.0)
    after = settles(
        lambda s: (
            value(s, "batchyard_engine_in_flight", engine="embedded") == 0
            and cancelled(s) == cancelled(before) + 1
        ),
        fleet,
        within=5,
    )
    tokens = value(after, "batchyard_engine_completion_tokens_total", engine="embedded")
    assert tokens > value(before, "batchyard_engine_completion_tokens_total", engine="embedded")
    time.sleep(1.0)  # the slot decodes no more of it
    later = scrape(fleet.front.url)
    assert value(later, "batchyard_engine_completion_tokens_total", engine="embedded") == tokens
    assert outcome(later, "succeeded") == outcome(before, "succeeded")
