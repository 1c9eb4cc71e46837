"""Every benchmark under bench/ still starts: its imports resolve and `--help` answers.

The benches run by hand, not in this suite, so a rename they depend on would otherwise only
show the next time someone measures (bench/upstream.py imported a helper that had moved).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


def test_there_are_benches() -> None:
    assert "throughput.py" in SCRIPTS and "upstream.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_starts(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
