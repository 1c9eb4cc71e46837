"""The fault run: two `batchyard serve` nodes on one PostgreSQL with their files in SeaweedFS
feed the fixed-latency upstream (harness/upstream.py) N lines as one batch, and while they
run each fault strikes once its number of lines are done:

  kill     kill -9 of the second node (the first keeps the API); it stays dead, its lines
           come back to the queue when their leases lapse;
  pg       PostgreSQL stops (`pg_ctl stop -m fast`: an operator's restart, every session
           ends), stays away and starts again. The nodes' PostgreSQL is then a private
           cluster of this run (harness/postgres.py), never the shared one;
  seaweed  SeaweedFS is killed, stays away, and starts again on the same ports and data.

`fault_run` returns the Outcome: lines failed, ended twice or never, and each fault's lines a
second before, during and after it. bench/faults.py runs it at full size and prints the
table; tests/e2e/test_faults_at_speed.py runs it at a few thousand lines.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness.live import LiveServer, start_server, stop_process, stop_server
from harness.postgres import SHARED_SERVER, Cluster, PgDatabase, private_postgres
from harness.seaweed import Seaweed, seaweed_server
from harness.upstream import CHAT, MODEL, start_upstream

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
        outputs = file_lines(c, api, b.get("output_file_id"), "the output file")
        out_ids = [json.loads(x)["custom_id"] for x in outputs]
        errors = file_lines(c, api, b.get("error_file_id"), "the error file")
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


def file_lines(c: httpx.Client, api: str, file_id: str | None, what: str) -> list[str]:
    """The lines of a batch's output or error file (none when it has no such file)."""
    if not file_id:
        return []
    got = c.get(f"{api}/files/{file_id}/content")
    if got.status_code != 200:
        raise SystemExit(f"{what}: {got.status_code} {got.text[:500]}")
    return [x for x in got.text.splitlines() if x.strip()]


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
    pg_server: str = SHARED_SERVER


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
