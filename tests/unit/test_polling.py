"""The one polling thread of the runner and the webhooks: a wake runs the next step at once,
a failed step backs off, and stop() ends the back-off instead of waiting it out."""

from __future__ import annotations

import logging
import threading
import time

from app.runtime.polling import PollingThread
from tests.waiting import until

log = logging.getLogger("tests.polling")


def test_a_wake_runs_the_next_step_before_the_interval_ends() -> None:
    steps: list[float] = []
    thread = PollingThread("t-wake", lambda: steps.append(time.monotonic()), 60.0, log=log)
    thread.start()
    try:
        until(lambda: len(steps), 10, "the first step")
        thread.wake()
        until(lambda: len(steps), 10, "the step after a wake", accept=lambda n: n >= 2)
    finally:
        thread.stop(10)
    assert not thread.alive


def test_stop_during_the_back_off_ends_it_at_once() -> None:
    failed = threading.Event()
    exited: list[bool] = []

    def boom() -> None:
        failed.set()
        raise RuntimeError("the database is gone")

    thread = PollingThread(
        "t-backoff", boom, 0.01, log=log, backoff=60.0, on_exit=lambda: exited.append(True)
    )
    thread.start()
    assert failed.wait(10)
    thread.wake()  # a wake does not end the back-off: only stop() does
    thread.stop(10)
    assert not thread.alive, "stop() waited out the back-off"
    assert exited == [True]
