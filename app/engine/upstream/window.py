"""The upstream engine's adaptive window: how many requests may be in flight, AIMD-like.

It halves on 429 or 503 (once per round trip), grows by about one per window of successes,
never above the configured concurrency, and a `Retry-After` pauses every new request until
it has passed. Owned by the engine's loop thread: no lock.
"""

from __future__ import annotations

import time


class AdaptiveWindow:
    """The in-flight limit of one upstream, and the Retry-After pause."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.window = float(concurrency)
        self.last_decrease = 0.0
        self.paused_until = 0.0  # time.monotonic() before which no new request starts

    def limit(self) -> int:
        return max(1, min(self.concurrency, int(self.window)))

    def shrink(self, started: float, retry_after: float | None) -> None:
        """Halve the window, once per round trip (the requests already out when the first
        429 came back do not halve it again), and pause for a Retry-After. `started` is when
        the throttled request went out (time.monotonic())."""
        if started >= self.last_decrease:
            self.window = max(1.0, self.window / 2)
            self.last_decrease = time.monotonic()
        if retry_after is not None:
            self.paused_until = max(self.paused_until, time.monotonic() + retry_after)

    def grow(self) -> None:
        # About one more slot per window of successes, up to the configured concurrency.
        if self.window < self.concurrency:
            self.window = min(float(self.concurrency), self.window + 1.0 / self.window)


__all__ = ["AdaptiveWindow"]
