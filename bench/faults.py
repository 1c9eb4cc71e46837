"""Faults at the fleet's speed: two nodes on one PostgreSQL with their files in SeaweedFS
(tests/seaweed.py) feed bench/fleet.py's fixed-latency upstream N lines as one batch, and
while they run, each fault of --faults strikes once its number of lines are done:

  kill@N     kill -9 of the second node (the first keeps the API); it stays dead, its lines
             come back to the queue when their leases lapse (--lease-seconds);
  pg@N       PostgreSQL stops (`pg_ctl stop -m fast`: an operator's restart, every session
             ends), stays away --away-s seconds and starts again. The nodes' PostgreSQL is
             then a private cluster of this run (tests/pg_cluster.py), never the shared one;
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
import contextlib
import json
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet import CHAT, DEFAULT_PG, MODEL, PgDatabase, start_upstream  # noqa: E402
from tests.live import LiveServer, start_server, stop_process, stop_server  # noqa: E402
from tests.pg_cluster import Cluster, private_postgres  # noqa: E402
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
    #: Faults not struck, each with why (no private PostgreSQL here).
    skipped: list[str] = field(default_factory=list)


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
        raise RuntimeError(f"SeaweedFS did not come back: {problem}")


def strike_pg(cluster: Cluster, away_s: float) -> None:
    """Stop PostgreSQL as an operator's restart does (every session ends), start it again."""
    cluster.stop("fast")
    time.sleep(away_s)
    cluster.start()


def strike_node(node: LiveServer, lease_seconds: int) -> None:
    """kill -9 of a node; back once the lines it held have lapsed (one lease later)."""
    node.process.kill()
    node.process.wait(30)
    time.sleep(lease_seconds)


def run(
    nodes: list[LiveServer],
    data: bytes,
    n: int,
    faults: list[Fault],
    strike: dict[str, Callable[[], None]],
    *,
    timeout: float,
    settle_s: float = 3.0,
    poll: float = 0.1,
) -> Outcome:
    """Create the batch on the first node, strike each fault (`strike[name]()`) once its
    lines are done and `settle_s` after the fault before it ended (so that each has an
    `after`), wait for the batch to end; the first node is never struck."""
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
                got = c.get(f"{api}/batches/{b['id']}")
            except httpx.HTTPError:
                got = None
            if got is None or got.status_code != 200:
                time.sleep(poll)  # the node's database is away: it answers again later
                continue
            b = got.json()
            now = time.perf_counter() - started
            counts = b.get("request_counts") or {}
            done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
            if b["status"] == "in_progress" and running_at is None:
                running_at = now
            if b["status"] in FINISHED:
                break
            last_back = max((f.back for f in faults if f.struck), default=0.0)
            if todo and done >= todo[0].at and now >= last_back + settle_s:
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


@dataclass
class Setup:
    """What a fault run starts, beside the faults: sizes, and where the logs go."""

    lines: int
    faults: list[Fault]
    logs: Path
    latency_ms: float = 100.0
    concurrency: int = 32
    pad_bytes: int = 600
    lease_seconds: int = 10
    away_s: float = 5.0
    timeout: float = 900.0
    pg_server: str = DEFAULT_PG


def fault_run(setup: Setup) -> Outcome:
    """Start the upstream, SeaweedFS, PostgreSQL (a private cluster when a `pg` fault is
    asked for and one can be made; else the pg fault is skipped) and two nodes; run the
    batch through the faults; stop everything. Raises LookupError when SeaweedFS cannot
    start."""
    tmp = setup.logs
    (tmp / "weed").mkdir(parents=True, exist_ok=True)
    faults = list(setup.faults)
    skipped: list[str] = []
    with contextlib.ExitStack() as stack:
        cluster: Cluster | None = None
        if any(f.name == "pg" for f in faults):
            made = stack.enter_context(private_postgres(tmp / "postgres.log"))
            if isinstance(made, str):
                skipped.append(f"pg: {made}")
                faults = [f for f in faults if f.name != "pg"]
            else:
                cluster = made
        db = PgDatabase(cluster.url if cluster else setup.pg_server)
        # A private cluster goes whole (and its restart broke the admin's connection).
        stack.callback(db.admin.dispose if cluster else db.drop)
        weed = stack.enter_context(seaweed_server(tmp / "weed", tmp / "seaweed.log"))
        if isinstance(weed, str):
            raise LookupError(weed)
        upstream_proc, upstream = start_upstream(setup.latency_ms)
        stack.callback(stop_process, upstream_proc)
        engine = f"up=openai:{upstream},concurrency={setup.concurrency}"
        files = f"s3://{weed.bucket}/faults-{secrets.token_hex(3)}"  # the nodes share it
        nodes: list[LiveServer] = []
        for k in range(2):
            node = start_server(
                tmp / "data",
                tmp / f"node{k}.log",
                env={"BATCHYARD_NODE_NAME": f"fault{k}", **weed.env()},
                args=[
                    "--no-embedded", "--engine", engine, "--database-url", db.url,
                    "--files-url", files, "--s3-endpoint", weed.endpoint,
                    "--lease-seconds", str(setup.lease_seconds),
                ],
                timeout=120,
            )  # fmt: skip
            nodes.append(node)
            stack.callback(stop_server, node)
        strike: dict[str, Callable[[], None]] = {
            "kill": lambda: strike_node(nodes[1], setup.lease_seconds),
            "seaweed": lambda: strike_seaweed(weed, setup.away_s),
        }
        if cluster is not None:
            strike["pg"] = lambda: strike_pg(cluster, setup.away_s)
        data = batch_lines(setup.lines, setup.pad_bytes)
        outcome = run(nodes, data, setup.lines, faults, strike, timeout=setup.timeout)
    outcome.skipped = skipped
    return outcome


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
        "--pg-server", default=DEFAULT_PG, help="without a pg fault: a fresh database there"
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
