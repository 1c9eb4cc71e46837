"""Faults at the fleet's speed: two nodes on one PostgreSQL with their files in SeaweedFS
(harness/seaweed.py) feed the fixed-latency upstream (harness/upstream.py) N lines as one batch, and
while they run, each fault of --faults strikes once its number of lines are done:

  kill@N     kill -9 of the second node (the first keeps the API); it stays dead, its lines
             come back to the queue when their leases lapse (--lease-seconds);
  pg@N       PostgreSQL stops (`pg_ctl stop -m fast`: an operator's restart, every session
             ends), stays away --away-s seconds and starts again. The nodes' PostgreSQL is
             then a private cluster of this run (harness/postgres.py), never the shared one;
  seaweed@N  SeaweedFS is killed, stays away --away-s seconds, and starts again on the same
             ports and data.

It reports the lines that failed (0 is the bar: a line whose input cannot be read while
the bucket is away waits and is tried again, as one waits for an upstream that is down),
lines that ended twice or never, the run time, and for each fault the lines a second
before it (from the previous fault's end), during it (struck to back: the restart done, or
for a kill one lease later) and after it (to the next fault, or the batch's end).

Each line's prompt is padded (--pad-bytes) so that the input file spans several of the
S3 store's read-ahead blocks (app/files/s3.py's READ_AHEAD_BYTES) and lines are read from
the bucket while it is away, not from a block read before. tests/e2e/test_faults_at_speed.py
runs the same at a few thousand lines; bench/bucket_restart.py is the SeaweedFS fault alone.

    python bench/faults.py                  # 20,000 lines, 100 ms, 2 nodes x C=32, all three
    python bench/faults.py --faults pg@5000 --lines 10000 --json out.json

Figures (2 cores shared with other engineers' runs, load average 2-5; main at f8c1621 with
this bench's commit): 20,000 lines, 100 ms, 2 nodes x C=32, lease 10 s, away 5 s: completed
in 78.1 s (256 lines/s), 0 failed, none twice or missing.

  | fault   | at line | away s | before l/s | during l/s | after l/s |
  |---------|---------|--------|------------|------------|-----------|
  | kill    |   3,012 |   10.0 |      424.8 |      277.9 |     266.4 |
  | pg      |   8,013 |    5.2 |      266.4 |        0.0 |     290.6 |
  | seaweed |  13,021 |   11.1 |      290.6 |      118.8 |     306.9 |

  (After the kill one node is left: about half the rate. SeaweedFS's 11 s: 5 away and 6
  to come back; lines read from blocks read before go on meanwhile.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.faults import Fault, Outcome, Setup, fault_run  # noqa: E402
from harness.postgres import SHARED_SERVER  # noqa: E402


def print_table(o: Outcome) -> None:
    print(
        f"{o.lines} lines: {o.status} in {o.seconds} s ({o.lines_per_s} lines/s); "
        f"completed {o.completed}, failed {o.failed}, duplicates {o.duplicates}, "
        f"missing {o.missing}"
    )
    print("| fault | at line | away s | before l/s | during l/s | after l/s |")
    print("|---|---|---|---|---|---|")
    for f in o.faults:
        print(
            f"| {f.name} | {f.done_struck} | {f.back - f.struck:.1f} | {f.before_lps} "
            f"| {f.during_lps} | {f.after_lps} |"
        )
    for e in o.errors:
        print("error line:", e[:300])
    for why in o.skipped:
        print("not struck:", why)


def parse_faults(text: str) -> list[Fault]:
    """'kill@3000,pg@8000,seaweed@13000' -> its faults."""
    out = []
    for item in filter(None, text.split(",")):
        name, _, at = item.partition("@")
        if name not in ("kill", "pg", "seaweed") or not at.isdigit():
            raise SystemExit(f"--faults: {item!r} is not kill@N, pg@N or seaweed@N")
        out.append(Fault(name, int(at)))
    return out


def main(argv: list[str] | None = None, *, faults: str = "kill@3000,pg@8000,seaweed@13000") -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lines", type=int, default=20_000)
    p.add_argument("--faults", default=faults, help="which faults, each at N lines done")
    p.add_argument(
        "--away-s", type=float, default=5.0, help="seconds PostgreSQL, SeaweedFS stay away"
    )
    p.add_argument("--lease-seconds", type=int, default=10, help="the nodes' lease")
    p.add_argument("--latency-ms", type=float, default=100.0)
    p.add_argument("--concurrency", type=int, default=32, help="each node's, to the upstream")
    p.add_argument("--pad-bytes", type=int, default=600, help="padding of each line's prompt")
    p.add_argument(
        "--pg-server", default=SHARED_SERVER, help="without a pg fault: a fresh database there"
    )
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", default="", help="also write the figures here")
    args = p.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="batchyard-faults-"))
    setup = Setup(
        lines=args.lines,
        faults=parse_faults(args.faults),
        logs=logs,
        latency_ms=args.latency_ms,
        concurrency=args.concurrency,
        pad_bytes=args.pad_bytes,
        lease_seconds=args.lease_seconds,
        away_s=args.away_s,
        timeout=args.timeout,
        pg_server=args.pg_server,
    )
    try:
        outcome = fault_run(setup)
    except LookupError as exc:
        raise SystemExit(str(exc)) from None
    print_table(outcome)
    print(f"logs: {logs}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(outcome), indent=2))
    ok = outcome.status == "completed" and not (
        outcome.failed or outcome.duplicates or outcome.missing
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
