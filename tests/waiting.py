"""Waiting in tests: `until(predicate, timeout)` instead of a hand-written deadline loop.

`until` lives in harness/waiting.py, since `batchyard serve`'s launcher (harness/live.py),
which the benches share, waits with it too; tests import it from here.
"""

from __future__ import annotations

from harness.waiting import until

__all__ = ["until"]
