"""Waiting in tests and benches: `until(predicate, timeout)` instead of a hand-written
deadline loop.

Calls `predicate` every `poll` seconds until its value is accepted (truthy, or what `accept`
says yes to) and returns that value; after `timeout` seconds it fails with an AssertionError
that says what was awaited and the last value seen. An exception the predicate raises ends the
wait at once (a server that exited, say), unless its type is in `ignoring` (a refused
connection while a server starts), when it counts as one more "not yet".
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

POLL = 0.02  # seconds between two calls: short, as most waits here end within a few
SHOWN = 2000  # characters of the last value an error repeats (a page or a log can be long)


def until(
    predicate: Callable[[], T],
    timeout: float,
    what: str | None = None,
    *,
    accept: Callable[[T], Any] = bool,
    poll: float = POLL,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """The first value of `predicate()` that `accept` says yes to, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: object = "(no value yet)"
    while True:
        try:
            value = predicate()
        except ignoring as error:
            last = error
        else:
            if accept(value):
                return value
            last = value
        left = deadline - time.monotonic()
        if left <= 0:
            shown = repr(last)
            if len(shown) > SHOWN:
                shown = shown[:SHOWN] + f"... ({len(shown)} characters)"
            awaited = what or _source(predicate)
            raise AssertionError(
                f"waited {round(timeout, 2):g}s for {awaited}; the last value: {shown}"
            )
        time.sleep(min(poll, left))


def _source(predicate: Callable[..., Any]) -> str:
    """The predicate's own text when no `what` was given (a lambda's line, a function's name)."""
    name = getattr(predicate, "__name__", "")
    if name and name != "<lambda>":
        return name
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)
