"""One node feeding a fast upstream: batchyard's own cost per line, against a direct client.

The fixed-latency upstream (harness/upstream.py: its own process, aiohttp on uvloop)
answers every `/v1/chat/completions` after --latency-ms and lists one model on `/v1/models`:
it stands for a GPU server answering short lines, so what is measured is the front's own cost. In one run:

  direct   the N bodies POSTed straight to the upstream by aiohttp, C at a time;
  sqlite   the N lines as one batch through `batchyard serve --no-embedded
           --engine up=openai:URL,concurrency=C` on SQLite, from create to `completed`;
  pg       the same on PostgreSQL (a fresh database on --pg-server), when it is reachable.

For each front it prints lines/s, the ratio to direct, the server's CPU seconds per line
(utime+stime of the server process from /proc, over the batch), the API's read latency meanwhile (p50/p99
of the bench's own list and retrieve calls, one pair every --poll-ms, 20 by default; `pushing_*` only those while
the batch was in progress, when the node pushes its lines), and the phases as the bench
saw them polling: validate (create -> in_progress), run (-> finalizing) and
finalize (-> completed). `--nodes 2` runs two nodes on one PostgreSQL (and one files location)
and reports the rate against one node. `--profile DIR` records py-spy (raw) of each server;
`python bench/spy_top.py DIR/*.txt` prints its top frames by thread. `--old DIR` (repeatable)
runs each front from another checkout too (`git archive COMMIT | tar -x -C DIR`), in the same
rounds, so a change is measured side by side; `--rounds N` repeats them and prints medians.
`--s3` runs each front also with its files in a bucket on SeaweedFS (`NAME-s3`, started here
by harness/seaweed.py) and prints the lines/s on S3 over those on the data dir.

    python bench/fleet.py                      # 3,000 lines, C=64, 20 ms
    python bench/fleet.py --lines 50000 --only sqlite,pg
    python bench/fleet.py --nodes 2 --only pg
    python bench/fleet.py --old /tmp/base --rounds 5 --only direct,sqlite
    python bench/fleet.py --s3 --rounds 3 --only direct,sqlite,pg
    python bench/fleet.py --upstream-url http://127.0.0.1:8080 --upstream-pid PID --lines 1000

`--upstream-url URL` sends the lines to a server already running there (llama-server, vLLM)
instead of the stand-in; the lines name `--model`, by default the first model its
`/v1/models` lists. `--upstream-pid` (its process) adds its CPU a line to the figures.

Figures (2 cores shared with other engineers' test runs, load average 4-6, so wall-clock
rates swing up to 2x between runs; CPU a line swings less; bench/README.md has the table):
  before issue 22 (3,000 lines, C=64, 20 ms): direct 1,828 l/s; sqlite 71 l/s (0.04x),
    9.4 ms CPU/line; pg 65 l/s (0.04x), 9.6 ms CPU/line.
  after: sqlite 1,150-1,775 l/s (0.35-0.73x), 0.43-0.62 ms CPU/line; pg 720-1,190 l/s
    (0.42-0.56x), 0.50-0.65 ms; 50,000 lines: sqlite 1,187 l/s (validate 2.2 s, run 37.6 s,
    finalize 2.4 s), pg 388 l/s (3.2 / 122.4 / 3.1 s), 653 l/s once the claim's batches
    were a CTE (4.7 / 68.7 / 3.2 s); two nodes on pg 1.35x one node.
  session 2 (load 0.5-2.9; medians of 3 rounds beside the session's first commit, ac24a3f):
    3,000 lines: sqlite 1,965 -> 2,247 l/s (0.72x -> 0.84x), 0.397 -> 0.300 ms CPU/line,
    p99 while pushing 41 -> 15 ms; pg 1,611 -> 1,930 l/s (0.59x -> 0.73x), 0.413 -> 0.327 ms,
    65 -> 41 ms. 50,000 lines, one round: sqlite 2,027 -> 2,110 l/s (0.75x -> 0.78x),
    0.379 -> 0.297 ms, p99 52 -> 26 ms; pg 1,748 -> 1,910 l/s (0.65x -> 0.71x), 0.366 ->
    0.292 ms, 61 -> 20 ms. The upstream stand-in takes 0.05-0.06 ms a line, the direct
    client 0.10-0.12 ms.
  session 3 (a machine about half as fast: the direct client 0.19-0.23 ms a line; beside
    5d65a9a): each upstream's client in its own process, a lean HTTP/1.1 pool, upstream
    lanes 4x deep. 3,000 lines: sqlite 1,517 -> 1,964 l/s (0.56x -> 0.70x), 0.58 -> 0.46 ms
    (the node 0.35, its client process 0.11); pg 1,220 -> 1,707 (0.46x -> 0.61x), 0.61 ->
    0.45 ms. 50,000 lines: sqlite 1,660 -> 2,218 (0.56x -> 0.75x), 0.544 -> 0.428 ms; pg
    1,311 -> 1,742 (0.44x -> 0.59x), 0.555 -> 0.421 ms. Two nodes on pg 1.20x one node.
    `node_cpu_ms_per_line` is the node's own process; `cpu_ms_per_line` adds its client
    processes.
  session 4 (AMD EPYC, 2 cores, the direct client 0.09-0.13 ms a line; main at 78f8b2a beside
    5d65a9a): 3,000 lines, 3 rounds: sqlite 2,196 -> 2,503 l/s (0.82x -> 0.94x), 0.293 ->
    0.227 ms; pg 2,009 -> 2,368 (0.74x -> 0.89x), 0.31 -> 0.243 ms (5 rounds of main alone:
    0.91x and 0.88x; its run phase 0.96-0.99x: validation and finalize take 60-110 ms of a
    1.3 s batch). 10,000 lines: sqlite 1.00x, pg 0.95x. 50,000 lines: sqlite 2,276 -> 2,569
    (0.90x -> 1.02x), pg 2,148 -> 2,601 (0.85x -> 1.03x). Two nodes on pg 1.59x one node.
    Against llama-server, polling every 20 ms: 0.88x / 0.85x, the node's CPU mostly the
    polling (5-5.6 ms a line, on llama-server's 2 cores); `--poll-ms 1000`: 0.99x / 0.96x.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.live import LiveServer, start_server, stop_process, stop_server  # noqa: E402
from harness.postgres import SHARED_SERVER, PgDatabase  # noqa: E402
from harness.seaweed import Seaweed, seaweed_server  # noqa: E402
from harness.upstream import CHAT, MODEL, start_upstream  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


# -- the upstream ------------------------------------------------------------------------


def first_model(url: str) -> str:
    """The first model an external upstream's `/v1/models` lists."""
    listed = httpx.get(url + "/v1/models", timeout=10)
    listed.raise_for_status()
    data = listed.json().get("data") or []
    if not data:
        raise SystemExit(f"{url}/v1/models lists no model: give --model")
    return str(data[0]["id"])


# -- the lines ---------------------------------------------------------------------------


def bodies(n: int, model: str = MODEL) -> list[dict[str, Any]]:
    return [
        {
            "model": model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": f"Is line {i} positive or negative?"}],
        }
        for i in range(n)
    ]


def jsonl(items: list[dict[str, Any]]) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": b}).encode()
        + b"\n"
        for i, b in enumerate(items)
    )


async def direct(url: str, items: list[dict[str, Any]], concurrency: int) -> float:
    """Seconds for aiohttp to POST every body, `concurrency` at a time."""
    import aiohttp

    todo = iter(items)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def worker() -> None:
            for b in todo:
                async with s.post(url + CHAT, json=b) as r:
                    await r.read()
                    assert r.status == 200, r.status

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


# -- the fronts --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def cpu_seconds(pid: int, *, tree: bool = True) -> float:
    """utime + stime of a process and (`tree`) every process below it (a node's upstream
    client processes are its own work)."""
    total = 0.0
    for p in [pid, *(descendants(pid) if tree else [])]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (from /proc/PID/task/*/children)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def pg_reachable(url: str) -> bool:
    try:
        PgDatabase(url).drop()
        return True
    except Exception as exc:  # no PostgreSQL here: that front is skipped
        print(f"pg: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
        return False


@dataclass(frozen=True)
class Front:
    """One front's nodes: their database ("" for a SQLite file), how many, the checkout they
    run from, the label of their profiles, and the bucket of their files (None: the data
    dir)."""

    database_url: str
    nodes: int
    root: Path = ROOT
    label: str = ""
    bucket: Seaweed | None = None


def through_batchyard(
    args: argparse.Namespace,
    upstream: str,
    data: bytes,
    front: Front,
    upstream_pid: int = 0,
) -> dict[str, Any]:
    n, database_url, nodes, root = args.lines, front.database_url, front.nodes, front.root
    label, bucket = front.label, front.bucket
    tmp = Path(tempfile.mkdtemp(prefix="batchyard-fleet-"))
    engine = f"up=openai:{upstream},concurrency={args.concurrency}"
    extra = ["--no-embedded", "--engine", engine]
    if database_url:
        extra += ["--database-url", database_url]
    s3_env: dict[str, str] = {}
    if bucket is not None:  # the files in the bucket, under a prefix of this run's own
        url = f"s3://{bucket.bucket}/fleet-{secrets.token_hex(4)}"
        extra += ["--files-url", url, "--s3-endpoint", bucket.endpoint]
        s3_env = bucket.env()
    servers: list[LiveServer] = []
    spies: list[subprocess.Popen[bytes]] = []
    try:
        for k in range(nodes):
            env = {"BATCHYARD_NODE_NAME": f"fleet{k}", **s3_env}
            servers.append(
                start_server(
                    tmp / "data", tmp / f"node{k}.log", env=env, args=extra, timeout=60, root=root
                )
            )
        api = servers[0].url + "/v1"
        with httpx.Client(timeout=120) as c:
            f = c.post(
                f"{api}/files",
                files={"file": ("fleet.jsonl", data)},
                data={"purpose": "batch"},
            )
            f.raise_for_status()
            cpu0 = [cpu_seconds(s.process.pid) for s in servers]
            own0 = [cpu_seconds(s.process.pid, tree=False) for s in servers]
            up0 = cpu_seconds(upstream_pid) if upstream_pid else 0.0
            if args.profile:
                spies += profilers(args, servers, f"{label or args.label}", database_url)
            started = time.perf_counter()
            b = c.post(
                f"{api}/batches",
                json={
                    "input_file_id": f.json()["id"],
                    "endpoint": CHAT,
                    "completion_window": "24h",
                },
            ).json()
            b, seen, reads, pushing = poll_to_end(c, api, b, args.poll_ms, started)
            seconds = time.perf_counter() - started
            cpu = sum(cpu_seconds(s.process.pid) for s in servers) - sum(cpu0)
            own = sum(cpu_seconds(s.process.pid, tree=False) for s in servers) - sum(own0)
            up_cpu = cpu_seconds(upstream_pid) - up0 if upstream_pid else 0.0
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            spy.wait(30)
        counts = b["request_counts"]
        if b["status"] != "completed" or counts["completed"] != n:
            raise SystemExit(f"the batch ended {b['status']} with {counts}")
        t_run = seen.get("in_progress", 0.0)
        t_fin = seen.get("finalizing", seconds)
        return {
            "status": b["status"],
            "seconds": round(seconds, 2),
            "lines_per_s": round(n / seconds, 1),
            "cpu_ms_per_line": round(cpu / n * 1000, 3),
            # of which the node's own process (the rest: its upstream client process)
            "node_cpu_ms_per_line": round(own / n * 1000, 3),
            "upstream_cpu_ms_per_line": round(up_cpu / n * 1000, 3),
            "validate_s": round(t_run, 2),
            "run_s": round(t_fin - t_run, 2),
            "finalize_s": round(seconds - t_fin, 2),
            "run_lines_per_s": round(n / max(t_fin - t_run, 1e-9), 1),
            "api_reads": len(reads),
            "api_p50_ms": round(percentile(reads, 50) * 1000, 1),
            "api_p99_ms": round(percentile(reads, 99) * 1000, 1),
            "pushing_p50_ms": round(percentile(pushing, 50) * 1000, 1),
            "pushing_p99_ms": round(percentile(pushing, 99) * 1000, 1),
        }
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.kill()
        for s in servers:
            stop_server(s)


def profilers(
    args: argparse.Namespace, servers: list[LiveServer], label: str, database_url: str
) -> list[subprocess.Popen[bytes]]:
    """A py-spy recording each node's process tree into --profile, until SIGINT."""
    spies = []
    for k, s in enumerate(servers):
        out = Path(args.profile) / f"{label}-{'pg' if database_url else 'sqlite'}-{k}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        spies.append(
            subprocess.Popen(
                [
                    sys.executable.replace("python", "py-spy"),
                    "record",
                    "--format",
                    "raw",
                    "--rate",
                    str(args.profile_rate),
                    "-o",
                    str(out),
                    "--pid",
                    str(s.process.pid),
                    "--threads",
                    "--subprocesses",
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return spies


def poll_to_end(
    c: httpx.Client, api: str, b: dict[str, Any], poll_ms: float, started: float
) -> tuple[dict[str, Any], dict[str, float], list[float], list[float]]:
    """A client's list + retrieve pair every `poll_ms` until the batch ends: the batch, when
    each status was first seen (seconds after `started`), and the API's latencies: every
    read, and those while it was in progress (the node pushing)."""
    seen: dict[str, float] = {}
    reads: list[float] = []
    pushing: list[float] = []
    while b["status"] not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(poll_ms / 1000)
        was = b["status"]
        t0 = time.perf_counter()
        c.get(f"{api}/batches", params={"limit": 20}).raise_for_status()
        t1 = time.perf_counter()
        b = c.get(f"{api}/batches/{b['id']}").json()
        pair = [t1 - t0, time.perf_counter() - t1]
        reads += pair
        if was == b["status"] == "in_progress":
            pushing += pair
        seen.setdefault(b["status"], time.perf_counter() - started)
    return b, seen, reads, pushing


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lines", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--only", default="direct,sqlite,pg", help="which of direct,sqlite,pg to run")
    p.add_argument("--nodes", type=int, default=1, help="2: also two nodes on PostgreSQL")
    p.add_argument(
        "--pg-server", default=os.environ.get("BATCHYARD_TEST_DATABASE_URL", SHARED_SERVER)
    )
    p.add_argument("--profile", default="", help="a folder for py-spy's raw profiles")
    p.add_argument("--label", default="run", help="names the profiles")
    p.add_argument("--profile-rate", type=int, default=50, help="py-spy's samples a second")
    p.add_argument("--json", default="", help="also write the figures here")
    p.add_argument(
        "--old", action="append", default=[], help="another checkout to run each front from"
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds of every front; medians")
    p.add_argument(
        "--s3",
        action="store_true",
        help="each front also with its files on SeaweedFS (harness/seaweed.py), named NAME-s3",
    )
    p.add_argument(
        "--upstream-url", default="", help="a server already running there instead of the stand-in"
    )
    p.add_argument("--model", default="", help="with --upstream-url: default its first model")
    p.add_argument("--upstream-pid", type=int, default=0, help="with --upstream-url: its CPU too")
    p.add_argument(
        "--poll-ms", type=float, default=20.0, help="the bench's list + retrieve pair, every N ms"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    only = set(args.only.split(","))
    proc, upstream, model, upstream_pid = upstream_of(args)
    items = bodies(args.lines, model)
    data = jsonl(items)
    results: dict[str, Any] = {
        "lines": args.lines,
        "concurrency": args.concurrency,
        "latency_ms": None if args.upstream_url else args.latency_ms,
        "upstream": args.upstream_url or "stand-in",
        "model": model,
    }
    # This checkout, then each --old one, in every round: side by side.
    sides = [("", ROOT)] + [(f"old:{Path(d).name}", Path(d).resolve()) for d in args.old]
    runs: dict[str, list[dict[str, Any]]] = {}
    stack = contextlib.ExitStack()
    try:
        buckets: list[Seaweed | None] = [None]  # the data dir, and with --s3 a bucket
        if args.s3:
            folder = Path(tempfile.mkdtemp(prefix="batchyard-fleet-seaweed-"))
            seaweed = stack.enter_context(seaweed_server(folder, folder / "seaweed.log"))
            if isinstance(seaweed, str):
                raise SystemExit(f"--s3: {seaweed}")
            buckets.append(seaweed)
        fronts = fronts_of(args, only)
        for rnd in range(args.rounds):
            if "direct" in only:
                d = through_direct(args, upstream, items, upstream_pid)
                runs.setdefault("direct", []).append(d)
                print("direct  " + "  ".join(f"{k}={v}" for k, v in d.items()), flush=True)
            for front, server_url, nodes, bucket in ((*f, b) for f in fronts for b in buckets):
                for side, root in sides:
                    name = f"{front}{'-s3' if bucket else ''} {side}".strip()
                    label = f"{args.label}{'-s3' if bucket else ''}{side.replace(':', '-')}-r{rnd}"
                    db = PgDatabase(server_url) if server_url else None
                    try:
                        r = through_batchyard(
                            args,
                            upstream,
                            data,
                            Front(db.url if db else "", nodes, root, label, bucket),
                            upstream_pid,
                        )
                    finally:
                        if db is not None:
                            db.drop()
                    if runs.get("direct"):
                        r["ratio"] = round(r["lines_per_s"] / runs["direct"][-1]["lines_per_s"], 3)
                    runs.setdefault(name, []).append(r)
                    print(f"{name:<9} " + "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)
        for name, rs in runs.items():
            results[name] = medians(rs)
        compare(args, results, runs, fronts)
    finally:
        stack.close()
        if proc is not None:
            stop_process(proc)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def upstream_of(
    args: argparse.Namespace,
) -> tuple[subprocess.Popen[bytes] | None, str, str, int]:
    """The upstream: --upstream-url's, or the stand-in started here (its process, to stop).
    (process, URL, model, pid)."""
    if args.upstream_url:
        upstream = args.upstream_url.rstrip("/")
        return None, upstream, args.model or first_model(upstream), args.upstream_pid
    proc, upstream = start_upstream(args.latency_ms)
    return proc, upstream, MODEL, proc.pid


def fronts_of(args: argparse.Namespace, only: set[str]) -> list[tuple[str, str, int]]:
    """The fronts to run: (name, database URL or "" for SQLite, nodes)."""
    fronts: list[tuple[str, str, int]] = []
    if "sqlite" in only:
        fronts.append(("sqlite", "", 1))
    if "pg" in only and pg_reachable(args.pg_server):
        fronts.append(("pg", args.pg_server, 1))
        if args.nodes > 1:
            fronts.append((f"pg-{args.nodes}-nodes", args.pg_server, args.nodes))
    return fronts


def through_direct(
    args: argparse.Namespace, upstream: str, items: list[dict[str, Any]], upstream_pid: int
) -> dict[str, Any]:
    """The lines straight to the upstream, --concurrency at a time: the ceiling."""
    own0 = os.times()
    up0 = cpu_seconds(upstream_pid) if upstream_pid else 0.0
    seconds = asyncio.run(direct(upstream, items, args.concurrency))
    own1 = os.times()
    up1 = cpu_seconds(upstream_pid) if upstream_pid else 0.0
    own = own1.user + own1.system - own0.user - own0.system
    return {
        "lines_per_s": round(args.lines / seconds, 1),
        "client_cpu_ms_per_line": round(own / args.lines * 1000, 3),
        "upstream_cpu_ms_per_line": round((up1 - up0) / args.lines * 1000, 3),
    }


def compare(
    args: argparse.Namespace,
    results: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    fronts: list[tuple[str, str, int]],
) -> None:
    """The medians, and the ratios side by side: nodes over one, S3 over the directory."""
    if args.rounds > 1 or args.old:
        print(f"medians of {args.rounds} round(s):")
        for name in runs:
            figures = "  ".join(f"{k}={v}" for k, v in results[name].items())
            print(f"  {name:<16}{figures}", flush=True)
    one, many = "pg", f"pg-{args.nodes}-nodes"
    if one in results and many in results:
        two = results[many]["lines_per_s"] / results[one]["lines_per_s"]
        results["nodes_over_one"] = round(two, 2)
        print(f"{args.nodes} nodes / 1 node on PostgreSQL: {two:.2f}x")
    for front, _, _ in fronts:
        if f"{front}-s3" in results:
            s3, directory = results[f"{front}-s3"]["lines_per_s"], results[front]["lines_per_s"]
            results[f"{front}_s3_over_directory"] = round(s3 / directory, 3)
            print(f"{front}: files on S3 / on the directory: {s3} / {directory} lines/s")
            print(f"  = {s3 / directory:.3f}x")


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over the rounds."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            out[key] = round(statistics.median(r[key] for r in runs), 3)
        else:
            out[key] = value
    return out


if __name__ == "__main__":
    raise SystemExit(main())
