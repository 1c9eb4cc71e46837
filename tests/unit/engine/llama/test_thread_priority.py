"""The engine's CPU priority (engine/llama/thread_priority.py): lowered in its own thread,
inherited by the threads it starts (llama.cpp's OpenMP workers), and nowhere else."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from app.config import Settings
from app.engine.llama.thread_priority import effective, lower_this_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread policy: Linux")


def test_auto_is_low_on_a_cpu_and_normal_on_a_gpu() -> None:
    assert effective("auto", on_gpu=False) == "low"
    assert effective("auto", on_gpu=True) == "normal"
    assert effective("low", on_gpu=True) == "low"
    assert effective("normal", on_gpu=False) == "normal"


def test_an_unknown_priority_is_refused() -> None:
    assert Settings(engine_priority=" Low ").engine_priority == "low"
    with pytest.raises(ValueError, match="unknown engine priority 'high'; choose one of auto"):
        Settings(engine_priority="high")


@linux
def test_the_thread_that_lowers_itself_and_its_children_run_idle_the_rest_do_not() -> None:
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = os.sched_getscheduler(0)

    def engine_thread() -> None:
        seen["said"] = lower_this_thread().startswith("low")
        seen["engine"] = os.sched_getscheduler(0)
        t = threading.Thread(target=child)  # as the OpenMP workers are started later
        t.start()
        t.join()

    before = os.sched_getscheduler(0)
    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen == {"said": True, "engine": os.SCHED_IDLE, "child": os.SCHED_IDLE}
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE  # this thread is untouched


@linux
def test_when_nothing_can_lower_it_the_start_up_line_names_both_refusals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(errno: int, what: str):  # type: ignore[no-untyped-def]
        def call(*_args: object) -> None:
            raise PermissionError(errno, what)

        return call

    monkeypatch.setattr(os, "sched_setscheduler", refuse(1, "Operation not permitted"))
    monkeypatch.setattr(os, "setpriority", refuse(13, "Permission denied"))
    said = lower_this_thread()
    assert said.startswith("normal (could not be lowered: ")
    assert "SCHED_IDLE: [Errno 1] Operation not permitted" in said
    assert "nice 19: [Errno 13] Permission denied" in said
