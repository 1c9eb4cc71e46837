"""harness/waiting.py's `until`: what it returns, and how it fails."""

from __future__ import annotations

import time

import pytest

from tests.waiting import until


def test_it_returns_the_first_truthy_value_once_the_predicate_gives_one() -> None:
    calls: list[int] = []

    def third() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert until(third, 5, "the third call") == 3
    assert len(calls) == 3


def test_accept_decides_and_the_accepted_value_comes_back() -> None:
    values = iter(["queued", "in_progress", "completed", "never read"])
    assert until(lambda: next(values), 5, accept=lambda s: s == "completed") == "completed"


def test_a_timeout_says_what_was_awaited_and_the_last_value() -> None:
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as caught:
        until(lambda: "in_progress", 0.1, "batch b1 to finish", accept=lambda s: s == "completed")
    assert time.monotonic() - t0 < 2
    assert str(caught.value) == "waited 0.1s for batch b1 to finish; the last value: 'in_progress'"


def test_without_what_the_error_quotes_the_predicate() -> None:
    with pytest.raises(AssertionError, match=r"lambda: 1 \+ 1 == 3"):
        until(lambda: 1 + 1 == 3, 0.05)


def test_a_long_last_value_is_cut_short() -> None:
    with pytest.raises(AssertionError, match=r"\.\.\. \(10002 characters\)$") as caught:
        until(lambda: "x" * 10_000, 0.05, "a y on the page", accept=lambda page: "y" in page)
    assert len(str(caught.value)) < 2100


def test_an_exception_from_the_predicate_ends_the_wait_at_once() -> None:
    def exited() -> bool:
        raise RuntimeError("the server exited with 1")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        until(exited, 30)
    assert time.monotonic() - t0 < 1


def test_ignored_exceptions_count_as_not_yet_and_show_as_the_last_value() -> None:
    calls: list[int] = []

    def refused_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ready"

    def refused() -> str:
        raise ConnectionError("refused")

    assert until(refused_twice, 5, ignoring=(ConnectionError,)) == "ready"
    with pytest.raises(AssertionError, match=r"the last value: ConnectionError\('refused'\)"):
        until(refused, 0.05, "a server", ignoring=(ConnectionError,))
