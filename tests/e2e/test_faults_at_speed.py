"""Faults at the fleet's speed, scaled down: two `batchyard serve` nodes on one PostgreSQL
with their files in a real SeaweedFS feed the fixed-latency upstream (harness/upstream.py)
a few thousand lines as one batch (harness/faults.py; bench/faults.py runs it at full
size), and while they run: kill -9 of one node, a PostgreSQL restart, a SeaweedFS restart.
After them every line ended once (none twice, none missing), none failed, and the batch completed.

PostgreSQL is a private cluster of this test (harness/postgres.py), never the machine's
shared server, which others' tests use; where none can be made (no initdb), the test runs
on a fresh database of the shared server and leaves the PostgreSQL restart out, with a
warning that says why.

Each prompt is padded so that the input file spans many of the S3 store's read-ahead blocks
(app/files/s3.py): lines must be read from the bucket while it is away, and wait for it.
"""

from __future__ import annotations

import shutil
import warnings

import pytest

from app.files.s3 import READ_AHEAD_BYTES
from harness.faults import Fault, Setup, batch_lines, fault_run
from tests.live import OUTPUT

pytestmark = pytest.mark.slow

LINES = 3000
#: Each node 8 lines at a time, 50 ms each: at most 320 lines a second between them, so
#: the faults strike while most lines still wait, and the batch takes seconds, not minutes.
CONCURRENCY = 8
LATENCY_MS = 50.0
PAD_BYTES = 2000
#: The lines a dead node held come back after this many seconds.
LEASE_SECONDS = 4
#: Seconds PostgreSQL and SeaweedFS stay away (SeaweedFS takes ~6 s more to come back).
AWAY_S = 3.0


def test_kill_a_node_restart_postgres_and_seaweed_every_line_ends_once() -> None:
    assert len(batch_lines(LINES, PAD_BYTES)) > 5 * READ_AHEAD_BYTES
    logs = OUTPUT / "faults-at-speed"  # its logs and data, this run's alone
    shutil.rmtree(logs, ignore_errors=True)
    faults = [Fault("kill", 300), Fault("pg", 1000), Fault("seaweed", 1800)]
    try:
        outcome = fault_run(
            Setup(
                lines=LINES,
                faults=faults,
                logs=logs,
                latency_ms=LATENCY_MS,
                concurrency=CONCURRENCY,
                pad_bytes=PAD_BYTES,
                lease_seconds=LEASE_SECONDS,
                away_s=AWAY_S,
                timeout=240,
            )
        )
    except LookupError as exc:  # no SeaweedFS here
        pytest.skip(str(exc))
    for why in outcome.skipped:
        warnings.warn(f"fault not struck: {why}", stacklevel=1)

    assert outcome.status == "completed", outcome
    assert (outcome.completed, outcome.failed) == (LINES, 0), outcome.errors
    assert (outcome.duplicates, outcome.missing) == (0, 0), outcome
    struck = [f.name for f in outcome.faults if f.struck]
    expected = ["kill", "seaweed"] if outcome.skipped else ["kill", "pg", "seaweed"]
    assert struck == expected, outcome.faults
    # Each fault came while lines still waited, and lines finished after it.
    assert all(f.done_struck < LINES and f.after_lps > 0 for f in outcome.faults)
    # The bucket's restart was felt: the surviving node found the input unreadable and
    # its lines waited for the store instead of failing.
    survivor = (logs / "node0.log").read_text(errors="replace")
    assert "input unreadable, waiting for the store" in survivor
    assert "the store answers again" in survivor
    print(
        f"\nfaults at speed: {LINES} lines in {outcome.seconds} s; "
        + "; ".join(
            f"{f.name}@{f.done_struck} {f.before_lps}->{f.during_lps}->{f.after_lps} l/s"
            for f in outcome.faults
        )
    )
