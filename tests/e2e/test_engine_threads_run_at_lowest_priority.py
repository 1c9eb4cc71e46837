"""A live server's threads: the engine's run at the lowest CPU priority, the API's do not.

The mechanism is in engine/llama/thread_priority.py; this checks it on the real model, after a
real decode, from the outside (/proc), as a user's `ps -L -o cls` would see it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from tests.live import LiveServer

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread scheduling policy: Linux only"
)
SCHED_OTHER, SCHED_IDLE = 0, 5


def policies(pid: int) -> dict[int, int]:
    """Each thread's scheduling policy (field 41 of /proc/PID/task/TID/stat)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        found[int(task.name)] = int(fields[41 - 3])
    return found


def test_the_engine_threads_run_below_the_api(live_server: LiveServer) -> None:
    client = OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    assert answer.choices[0].message.content is not None
    log = live_server.log()
    assert "engine priority: low (SCHED_IDLE)" in log
    threads = int(re.search(r"engine ready: .* threads=(\d+)", log).group(1))  # type: ignore[union-attr]
    found = policies(live_server.process.pid)
    idle = [tid for tid, policy in found.items() if policy == SCHED_IDLE]
    # The engine's own thread and, after a decode, llama.cpp's workers (threads - 1).
    assert len(idle) >= threads, found
    # The main thread (the event loop) and every other thread are ordinary.
    assert found[live_server.process.pid] == SCHED_OTHER
    assert len(found) > len(idle)
