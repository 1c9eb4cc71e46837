"""What an engine has done, for /metrics and the dashboard: requests by outcome, prompt and
completion tokens, and the generated tokens per second over the last few seconds. One class
for both engines (llama.cpp's server keeps the same figures in its server_metrics).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from app.engine.base import EngineStats

#: The tokens/s figure is over this many seconds.
RATE_WINDOW_S = 5.0


class Counters:
    """Thread-safe: the engine's own thread counts, any thread takes a snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, int] = {}
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._rate: deque[tuple[float, int]] = deque()  # (when, tokens generated)

    def count(self, outcome: str) -> None:
        """One request ended: "succeeded", "failed", "unavailable" (engine down) or "cancelled"."""
        with self._lock:
            self._requests[outcome] = self._requests.get(outcome, 0) + 1

    def tokens(self, *, prompt: int = 0, completion: int = 0) -> None:
        """Tokens evaluated from prompts, and tokens generated (which the rate counts)."""
        with self._lock:
            self._prompt_tokens += prompt
            if completion:
                self._completion_tokens += completion
                self._rate.append((time.monotonic(), completion))

    def usage(self, usage: object) -> None:
        """The tokens an OpenAI answer's `usage` names (nothing when it has none)."""
        if isinstance(usage, dict):
            self.tokens(
                prompt=int(usage.get("prompt_tokens") or 0),
                completion=int(usage.get("completion_tokens") or 0),
            )

    def snapshot(self, *, active: int, queued: int) -> EngineStats:
        """The figures now, with the engine's own count of running and queued requests."""
        with self._lock:
            now = time.monotonic()
            while self._rate and self._rate[0][0] < now - RATE_WINDOW_S:
                self._rate.popleft()
            tokens = sum(n for _, n in self._rate)
            span = min(RATE_WINDOW_S, now - self._rate[0][0]) if self._rate else 0.0
            return EngineStats(
                active_slots=active,
                queue_depth=queued,
                tokens_per_second=tokens / span if span > 0.05 else 0.0,
                prompt_tokens_total=self._prompt_tokens,
                completion_tokens_total=self._completion_tokens,
                requests_total=dict(self._requests),
            )
