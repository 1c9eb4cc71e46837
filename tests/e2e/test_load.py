"""Load: 20 clients upload, create, list and poll while a batch runs on the real model.

Runs the short version of bench/api_load.py (which starts its own live server on 127.0.0.1)
and checks what a user would notice: no failed request, no "database is locked", the
batch still moving. The latency and throughput figures are printed, not asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import ROOT

pytestmark = pytest.mark.slow


def test_twenty_clients_while_a_batch_runs(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "api_load.py"),
            "--clients",
            "20",
            "--duration",
            # Each client makes a batch in its third round of requests, about 2.5 s in.
            "4",
            "--idle-requests",
            "60",
            "--lines",
            # Enough work to keep the batch running through both 4 s phases.
            "200",
            "--max-tokens",
            "16",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    print(done.stdout, done.stderr[-3000:])
    result = json.loads(out.read_text())
    assert result["idle"]["requests"] == 60 and result["idle"]["failed"] == 0
    load = result["load"]
    assert load["failed"] == 0, load["failures"]
    assert load["requests"] >= 100  # 20 clients really ran
    assert result["batches_created_under_load"] > 0
    burst = result["burst"]  # 20 uploads at one instant, after the load phase
    assert burst["requests"] == 20 and burst["failed"] == 0, burst["failures"]
    assert result["database_is_locked"] == 0
    assert result["server_errors_logged"] == 0
    assert done.returncode == 0
