"""A SeaweedFS restart in the middle of a fast batch: two nodes on one PostgreSQL with their
files in SeaweedFS (tests/seaweed.py) feed bench/fleet.py's fixed-latency upstream N lines
as one batch; once --at of them are done, SeaweedFS is killed, stays away --away-s seconds,
and starts again on the same ports and data.

It reports the lines that failed (0 is the bar: a line whose input cannot be read while
the bucket is away waits and is tried again), lines that ended more than once or not at
all, the run time, and the lines a second before the restart, while the bucket was away
(kill to answering again) and after it.

Each line's prompt is padded (--pad-bytes) so that the input file spans several of the
S3 store's read-ahead blocks (app/files/s3.py's READ_AHEAD_BYTES) and lines are read from
the bucket while it is away, not from a block read before.

    python bench/bucket_restart.py                   # 20,000 lines, 100 ms, 2 nodes x C=32
    python bench/bucket_restart.py --lines 5000 --at 2000 --json out.json

Figures (2 cores shared with other engineers' runs): before the lines that wait for the
bucket (fa18a8a), 4,643 of 20,000 lines failed with "the object store did not answer";
after it 0 failed, 596 -> 86 -> 510 lines/s before/during/after. Rebuilt (main at f8c1621,
load average 4-5): 0 of 20,000 failed, none twice or missing, 56.1 s (357 lines/s);
613 -> 23 -> 476 lines/s; SeaweedFS away 20.5 s, most of it its master's raft election on
restart (SeaweedFS's default election timeout is 10 s).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet import CHAT, DEFAULT_PG, MODEL, PgDatabase, start_upstream  # noqa: E402
from tests.live import LiveServer, start_server, stop_process, stop_server  # noqa: E402
from tests.seaweed import Seaweed, seaweed_server  # noqa: E402

FINISHED = ("completed", "failed", "expired", "cancelled")


@dataclass
class Fault:
    """One fault struck while the batch ran, and what the lines did around it."""

    name: str
    at: int  # lines done when it is to strike
    struck: float = 0.0  # seconds into the run
    back: float = 0.0  # seconds into the run when the outage ended
    done_struck: int = 0  # lines done when it struck
    done_back: int = 0  # lines done when it ended
    before_lps: float = 0.0
    during_lps: float = 0.0
    after_lps: float = 0.0


@dataclass
class Outcome:
    lines: int
    status: str
    seconds: float
    lines_per_s: float
    completed: int
    failed: int
    duplicates: int
    missing: int
    errors: list[str] = field(default_factory=list)  # the first few error lines
    faults: list[Fault] = field(default_factory=list)


def batch_lines(n: int, pad: int) -> bytes:
    """n one-token chat lines for the upstream's model, each prompt padded by `pad` bytes."""
    filler = "x" * pad
    return b"".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": CHAT,
                "body": {
                    "model": MODEL,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": f"Line {i}. {filler}"}],
                },
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


def strike_seaweed(weed: Seaweed, away_s: float) -> None:
    """Kill SeaweedFS (SIGTERM takes it ~10 s), leave it away, start it again."""
    weed.stop(kill=True)
    time.sleep(away_s)
    problem = weed.start()
    if problem:
        raise SystemExit(f"SeaweedFS did not come back: {problem}")


def run(
    nodes: list[LiveServer],
    data: bytes,
    n: int,
    faults: list[Fault],
    strike: dict[str, Any],
    *,
    timeout: float,
    poll: float = 0.1,
) -> Outcome:
    """Create the batch on the first node, strike each fault (`strike[name]()`) once its
    lines are done, wait for the batch to end; the first node is never struck."""
    api = nodes[0].api
    with httpx.Client(timeout=60) as c:
        f = c.post(f"{api}/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
        f.raise_for_status()
        b = c.post(
            f"{api}/batches",
            json={"input_file_id": f.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
        ).json()
        started = time.perf_counter()
        todo = sorted(faults, key=lambda x: x.at)
        running_at: float | None = None
        while True:
            try:
                b = c.get(f"{api}/batches/{b['id']}").json()
            except httpx.HTTPError:
                time.sleep(poll)  # the node's database is away: it answers again later
                continue
            now = time.perf_counter() - started
            counts = b.get("request_counts") or {}
            done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
            if b["status"] == "in_progress" and running_at is None:
                running_at = now
            if b["status"] in FINISHED:
                break
            if todo and done >= todo[0].at:
                fault = todo.pop(0)
                fault.struck, fault.done_struck = now, done
                strike[fault.name]()
                fault.back = time.perf_counter() - started
                fault.done_back = -1  # the first count read after it
            for fault in faults:
                if fault.done_back == -1 and now >= fault.back:
                    fault.done_back = done
            if now > timeout:
                raise SystemExit(f"the batch did not end within {timeout:.0f} s: {b}")
            time.sleep(poll)
        seconds = time.perf_counter() - started
        out_ids: list[str] = []
        errors: list[str] = []
        if b.get("output_file_id"):
            got = c.get(f"{api}/files/{b['output_file_id']}/content")
            if got.status_code != 200:
                raise SystemExit(f"the output file: {got.status_code} {got.text[:500]}")
            text = got.text
            out_ids = [json.loads(x)["custom_id"] for x in text.splitlines() if x.strip()]
        if b.get("error_file_id"):
            got = c.get(f"{api}/files/{b['error_file_id']}/content")
            if got.status_code != 200:
                raise SystemExit(f"the error file: {got.status_code} {got.text[:500]}")
            text = got.text
            errors = [x for x in text.splitlines() if x.strip()]
    ended = Counter(out_ids) + Counter(json.loads(e)["custom_id"] for e in errors)
    for fault in faults:
        if fault.done_back == -1:
            fault.done_back = n
    rates(faults, running_at or 0.0, seconds, n)
    counts = b["request_counts"]
    return Outcome(
        lines=n,
        status=b["status"],
        seconds=round(seconds, 2),
        lines_per_s=round(n / seconds, 1),
        completed=counts["completed"],
        failed=counts["failed"],
        duplicates=sum(k - 1 for k in ended.values()),
        missing=sum(f"l{i}" not in ended for i in range(n)),
        errors=errors[:3],
        faults=faults,
    )


def rates(faults: list[Fault], running_at: float, end: float, n: int) -> None:
    """Each fault's lines a second: before (from the previous fault's end, or the run's
    start), during (struck to back), after (back to the next fault, or the batch's end)."""
    done_faults = [f for f in faults if f.struck]
    for i, f in enumerate(done_faults):
        t0, n0 = (done_faults[i - 1].back, done_faults[i - 1].done_back) if i else (running_at, 0)
        t1, n1 = (
            (done_faults[i + 1].struck, done_faults[i + 1].done_struck)
            if i + 1 < len(done_faults)
            else (end, n)
        )
        f.before_lps = round((f.done_struck - n0) / max(f.struck - t0, 1e-9), 1)
        f.during_lps = round((f.done_back - f.done_struck) / max(f.back - f.struck, 1e-9), 1)
        f.after_lps = round((n1 - f.done_back) / max(t1 - f.back, 1e-9), 1)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lines", type=int, default=20_000)
    p.add_argument("--at", type=int, default=13_000, help="lines done when SeaweedFS goes")
    p.add_argument("--away-s", type=float, default=5.0, help="seconds SeaweedFS stays away")
    p.add_argument("--latency-ms", type=float, default=100.0)
    p.add_argument("--concurrency", type=int, default=32, help="each node's, to the upstream")
    p.add_argument("--pad-bytes", type=int, default=600, help="padding of each line's prompt")
    p.add_argument("--pg-server", default=DEFAULT_PG, help="a fresh database is made there")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", default="", help="also write the figures here")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="batchyard-bucket-restart-"))
    (tmp / "weed").mkdir()
    upstream_proc, upstream = start_upstream(args.latency_ms)
    db = PgDatabase(args.pg_server)
    nodes: list[LiveServer] = []
    try:
        with seaweed_server(tmp / "weed", tmp / "seaweed.log") as weed:
            if isinstance(weed, str):
                raise SystemExit(weed)
            try:
                engine = f"up=openai:{upstream},concurrency={args.concurrency}"
                files = f"s3://{weed.bucket}/restart-{secrets.token_hex(3)}"  # the nodes share it
                for k in range(2):
                    nodes.append(
                        start_server(
                            tmp / "data",
                            tmp / f"node{k}.log",
                            env={"BATCHYARD_NODE_NAME": f"restart{k}", **weed.env()},
                            args=[
                                "--no-embedded",
                                "--engine",
                                engine,
                                "--database-url",
                                db.url,
                                "--files-url",
                                files,
                                "--s3-endpoint",
                                weed.endpoint,
                            ],
                            timeout=120,
                        )
                    )
                fault = Fault("seaweed", args.at)
                outcome = run(
                    nodes,
                    batch_lines(args.lines, args.pad_bytes),
                    args.lines,
                    [fault],
                    {"seaweed": lambda: strike_seaweed(weed, args.away_s)},
                    timeout=args.timeout,
                )
            finally:
                for node in nodes:
                    stop_server(node)
    finally:
        stop_process(upstream_proc)
        db.drop()
    print_table(outcome)
    print(f"logs: {tmp}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(outcome), indent=2))
    ok = outcome.status == "completed" and not (
        outcome.failed or outcome.duplicates or outcome.missing
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
