"""API latency idle and under load, against a live `batchyard serve` this script starts.

Four phases on one server, side by side in one run:
  1. idle: sequential list/retrieve requests with nothing else going on;
  2. quiet: a batch runs on the real model, polled once a second (the engine's own rate);
  3. load: N clients upload files, create, list and poll batches while it runs, each
     pausing --think s between requests, their starts spread over one round;
  4. burst: the N clients upload one file each at the same instant, the batch still running.
It prints p50/p99 latency for (1) and (3), p50/max for (4), the batch's output tokens/s
in (2) and (3), failed requests, and how often "database is locked" appears in the server log.
Only 127.0.0.1 is contacted; every phase is bounded in count and time.

    python bench/api_load.py --help
    python bench/api_load.py --clients 20 --duration 30 --json result.json
    python bench/api_load.py --database-url postgresql+psycopg://postgres@127.0.0.1/EMPTY_DB
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
MAX_DURATION = 120.0
MAX_CLIENTS = 64


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    by_route: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    unanswered: int = 0  # requests that got no response at all
    lock: threading.Lock = field(default_factory=threading.Lock)

    def timed(
        self, client: httpx.Client, method: str, url: str, **kw: Any
    ) -> httpx.Response | None:
        start = time.perf_counter()
        try:
            r = client.request(method, url, **kw)
        except httpx.HTTPError as exc:
            with self.lock:
                self.unanswered += 1
                self.failures.append(f"{method} {url}: {type(exc).__name__}: {exc}")
            return None
        elapsed = time.perf_counter() - start
        with self.lock:
            self.latencies.append(elapsed)
            self.by_route.setdefault(route_of(method, url), []).append(elapsed)
            if r.status_code != 200:
                self.failures.append(f"{method} {url}: {r.status_code} {r.text[:200]}")
        return r

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "requests": len(lat) + self.unanswered,
            "failed": len(self.failures),
            "p50_ms": round(percentile(lat, 50) * 1000, 1),
            "p99_ms": round(percentile(lat, 99) * 1000, 1),
            "mean_ms": round(statistics.fmean(lat) * 1000, 1) if lat else 0.0,
            "failures": self.failures[:10],
            "routes": {
                route: {
                    "requests": len(times),
                    "p50_ms": round(percentile(sorted(times), 50) * 1000, 1),
                    "p99_ms": round(percentile(sorted(times), 99) * 1000, 1),
                }
                for route, times in sorted(self.by_route.items())
            },
        }


def route_of(method: str, url: str) -> str:
    """`GET /v1/batches/{id}` for a URL with an id in it: the per-route figures' key."""
    path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
    parts = ["{id}" if "_" in p or "-" in p else p for p in path.split("/")]
    return f"{method} /" + "/".join(parts)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    data_dir: Path, log_path: Path, parallel: int, database_url: str = "", priority: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--no-browser",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--parallel",
        str(parallel),
        "--ctx-size",
        "1024",
        *(["--database-url", database_url] if database_url else []),
        *(["--engine-priority", priority] if priority else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "ab")  # noqa: SIM115 - the server writes it until it stops
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"the server was not ready in 180 s; see {log_path}")


def chat_line(cid: str, text: str, max_tokens: int) -> str:
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "m",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
    )


def create_batch(client: httpx.Client, api: str, lines: list[str]) -> str:
    f = client.post(
        api + "/files",
        files={"file": ("load.jsonl", ("\n".join(lines) + "\n").encode())},
        data={"purpose": "batch"},
    )
    f.raise_for_status()
    b = client.post(
        api + "/batches",
        json={
            "input_file_id": f.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    b.raise_for_status()
    return str(b.json()["id"])


def output_tokens(client: httpx.Client, api: str, batch_id: str) -> tuple[int, str]:
    b = client.get(f"{api}/batches/{batch_id}").json()
    return int(b["usage"]["output_tokens"]), str(b["status"])


def idle_phase(api: str, requests: int, batch_id: str, file_id: str) -> dict[str, Any]:
    tally = Tally()
    paths = ["/batches?limit=20", "/files", f"/batches/{batch_id}", f"/files/{file_id}"]
    with httpx.Client(timeout=30) as c:
        for i in range(requests):
            tally.timed(c, "GET", api + paths[i % len(paths)])
    return tally.summary()


def rate(api: str, batch_id: str, seconds: float) -> float | None:
    """The batch's output tokens per second over `seconds` (None if it ended meanwhile)."""
    with httpx.Client(timeout=30) as c:
        t0, (tok0, _) = time.perf_counter(), output_tokens(c, api, batch_id)
        end = t0 + seconds
        ended = False
        # The phase lasts its full time even when the batch ends early: the clients' load
        # is what is being measured; only the rate is then unknown.
        while time.perf_counter() < end:
            time.sleep(min(1.0, max(0.0, end - time.perf_counter())))
            _, status = output_tokens(c, api, batch_id)
            ended = ended or status != "in_progress"
        tok1, status = output_tokens(c, api, batch_id)
        if ended or status != "in_progress":
            return None
        return (tok1 - tok0) / (time.perf_counter() - t0)


def client_loop(
    api: str,
    batch_id: str,
    stop: threading.Event,
    tally: Tally,
    made: list[str],
    *,
    n: int,
    clients: int,
    think: float,
) -> None:
    """One client: upload, sometimes create a batch, list, poll; `think` s between requests."""

    def create(file_id: str) -> None:
        b = tally.timed(
            c,
            "POST",
            api + "/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        if b is not None and b.status_code == 200:
            with tally.lock:
                made.append(b.json()["id"])

    # Clients start spread over one round (five requests and pauses), not all at the same
    # instant: a synchronized start is a burst of uploads, measured on its own
    # (burst_phase), not the steady load this phase is about.
    if stop.wait(think * 5 * n / max(1, clients)):
        return
    with httpx.Client(timeout=60) as c:
        i = 0
        while True:
            i += 1
            data = (chat_line(f"c{n}-{i}", "Say hi.", 4) + "\n").encode()
            f = tally.timed(
                c,
                "POST",
                api + "/files",
                files={"file": (f"client{n}.jsonl", data)},
                data={"purpose": "batch"},
            )
            rest: list[Callable[[], object]] = [
                lambda: tally.timed(c, "GET", api + "/batches?limit=20"),
                lambda: tally.timed(c, "GET", f"{api}/batches/{batch_id}"),
                lambda: tally.timed(c, "GET", api + "/files?limit=50"),
            ]
            if i % 3 == 0 and f is not None and f.status_code == 200:
                rest.insert(0, functools.partial(create, f.json()["id"]))
            # `think` s before each request; once the phase is over the client stops (the
            # round's remaining requests would otherwise all go at once, a burst that no
            # client of this load makes).
            for send in rest:
                if stop.wait(think):
                    return
                send()
            if stop.wait(think):
                return


def burst_phase(api: str, clients: int) -> dict[str, Any]:
    """Every client uploads one file at the same instant (after a barrier), once."""
    tally, barrier = Tally(), threading.Barrier(clients)
    data = (chat_line("burst", "Say hi.", 4) + "\n").encode()

    def one() -> None:
        with httpx.Client(timeout=60) as c:
            c.get(api.removesuffix("/v1") + "/health")  # connected before the barrier
            barrier.wait()
            files = {"file": ("burst.jsonl", data)}
            tally.timed(c, "POST", api + "/files", files=files, data={"purpose": "batch"})

    threads = [threading.Thread(target=one, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    summary = tally.summary()
    summary["max_ms"] = round(max(tally.latencies, default=0.0) * 1000, 1)
    return summary


def load_phase(
    api: str, batch_id: str, clients: int, duration: float, think: float
) -> tuple[dict[str, Any], float | None, list[str]]:
    tally, stop = Tally(), threading.Event()
    made: list[str] = []
    threads = [
        threading.Thread(
            target=client_loop,
            args=(api, batch_id, stop, tally, made),
            kwargs={"n": n, "clients": clients, "think": think},
            daemon=True,
        )
        for n in range(clients)
    ]
    for t in threads:
        t.start()
    measured = rate(api, batch_id, duration)
    stop.set()
    for t in threads:
        t.join(90)
    return tally.summary(), measured, made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--clients",
        type=int,
        default=20,
        help=f"concurrent clients in the load phase (max {MAX_CLIENTS})",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help=f"seconds of the quiet and the load phase each (max {MAX_DURATION:g})",
    )
    p.add_argument("--idle-requests", type=int, default=200, help="requests in the idle phase")
    p.add_argument("--lines", type=int, default=400, help="lines in the batch that runs meanwhile")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each of its lines")
    p.add_argument(
        "--parallel", type=int, default=4, help="engine slots (--parallel of the server)"
    )
    p.add_argument(
        "--think",
        type=float,
        default=0.25,
        help="seconds each client waits between its requests (0: a tight loop)",
    )
    p.add_argument(
        "--database-url",
        default="",
        help="the server's --database-url, e.g. postgresql+psycopg://postgres@127.0.0.1/EMPTY_DB "
        "(an empty database; default: SQLite in the data dir)",
    )
    p.add_argument(
        "--engine-priority",
        default="",
        help="the server's --engine-priority (low, normal, auto; default: the server's own)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument(
        "--keep", type=Path, default=None, help="data dir to use and keep (default: a temp dir)"
    )
    args = p.parse_args(argv)
    clients = max(1, min(args.clients, MAX_CLIENTS))
    duration = max(1.0, min(args.duration, MAX_DURATION))

    tmp = tempfile.TemporaryDirectory(prefix="batchyard-load-")
    data = args.keep or Path(tmp.name) / "data"
    log_path = Path(tmp.name) / "server.log" if args.keep is None else args.keep / "server.log"
    data.mkdir(parents=True, exist_ok=True)
    proc, url = start_server(data, log_path, args.parallel, args.database_url, args.engine_priority)
    api = url + "/v1"
    try:
        with httpx.Client(timeout=60) as c:
            lines = [
                chat_line(f"main-{i}", f"Write a line about the number {i}.", args.max_tokens)
                for i in range(args.lines)
            ]
            # One finished batch first, so the idle phase reads real rows.
            warm = create_batch(c, api, lines[:1])
            while output_tokens(c, api, warm)[1] not in ("completed", "failed"):
                time.sleep(0.2)
            warm_file = c.get(f"{api}/batches/{warm}").json()["input_file_id"]
            idle = idle_phase(api, args.idle_requests, warm, warm_file)
            main_batch = create_batch(c, api, lines)
            while output_tokens(c, api, main_batch)[0] == 0:
                time.sleep(0.2)
        quiet_rate = rate(api, main_batch, duration)
        loaded, load_rate, made = load_phase(api, main_batch, clients, duration, args.think)
        burst = burst_phase(api, clients)
        with httpx.Client(timeout=60) as c:
            for bid in [main_batch, *made]:
                c.post(f"{api}/batches/{bid}/cancel")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    log_text = log_path.read_text(errors="replace")
    result = {
        "database": "postgresql" if args.database_url else "sqlite",
        "engine_priority": args.engine_priority or "default",
        "clients": clients,
        "duration_s": duration,
        "idle": idle,
        "load": loaded,
        "burst": burst,
        "batches_created_under_load": len(made),
        "tokens_per_s_quiet": round(quiet_rate, 1) if quiet_rate is not None else None,
        "tokens_per_s_load": round(load_rate, 1) if load_rate is not None else None,
        "database_is_locked": log_text.count("database is locked"),
        "server_errors_logged": log_text.count("Traceback"),
    }
    tmp.cleanup()
    print(
        f"database: {result['database']}\n"
        f"idle: {idle['requests']} requests, p50 {idle['p50_ms']} ms, p99 {idle['p99_ms']} ms\n"
        f"load ({clients} clients, {duration:g} s): {loaded['requests']} requests, "
        f"{loaded['failed']} failed, p50 {loaded['p50_ms']} ms, p99 {loaded['p99_ms']} ms, "
        f"{len(made)} batches created\n"
        f"burst ({clients} uploads at one instant, engine still busy): p50 {burst['p50_ms']} ms, "
        f"max {burst['max_ms']} ms\n"
        f"engine: {result['tokens_per_s_quiet']} output tok/s quiet, "
        f"{result['tokens_per_s_load']} under load\n"
        f'server log: {result["database_is_locked"]} x "database is locked", '
        f"{result['server_errors_logged']} tracebacks"
    )
    for route, fig in loaded["routes"].items():
        print(f"  under load {route}: {fig['requests']} requests, p50 {fig['p50_ms']} ms, "
              f"p99 {fig['p99_ms']} ms")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = (
        loaded["failed"] == 0
        and idle["failed"] == 0
        and burst["failed"] == 0
        and result["database_is_locked"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
