"""Two nodes on one PostgreSQL database against one node, on the embedded model.

Each round starts the node(s) on a fresh database and a fresh files location, waits for
them to be ready (model loaded), then times one batch of the same lines from creation to
completed. Three set-ups run in turn, round after round, and the figures are ratios of
their medians, measured side by side:

  one      one node with --threads-per-node threads;
  two      two nodes, each with --threads-per-node threads: what a second machine adds
           (ideal 2.0 while the cores are free; two_over_one);
  one-big  one node with both nodes' threads: the same CPU as `two` in one process, so
           two_over_one_big is what sharing one queue between processes costs.

    python bench/nodes.py --help
    python bench/nodes.py --lines 64 --max-tokens 16 --rounds 2 --json nodes.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, make_url, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.api_load import chat_line, create_batch, start_server  # noqa: E402

DEFAULT_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


class Database:
    """A fresh database on the server for one round, dropped afterwards."""

    def __init__(self, server_url: str) -> None:
        self.server = make_url(server_url)
        self.name = f"batchyard_bench_{secrets.token_hex(5)}"
        self.admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        self.url = self.server.set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


def one_round(
    args: argparse.Namespace, setup: str, nodes: int, threads: int, lines: list[str]
) -> dict[str, Any]:
    db = Database(args.server)
    tmp = tempfile.TemporaryDirectory(prefix="batchyard-nodes-")
    data = Path(tmp.name) / "shared"
    data.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for n in range(nodes):
            os.environ["BATCHYARD_THREADS"] = str(threads)
            os.environ["BATCHYARD_NODE_NAME"] = f"bench{n}"
            proc, url = start_server(data, Path(tmp.name) / f"node{n}.log", args.parallel, db.url)
            procs.append(proc)
            urls.append(url)
        api = urls[0] + "/v1"
        with httpx.Client(timeout=60) as c:
            started = time.perf_counter()
            batch_id = create_batch(c, api, lines)
            while True:
                b = c.get(f"{api}/batches/{batch_id}").json()
                if b["status"] in ("completed", "failed", "expired", "cancelled"):
                    break
                time.sleep(0.1)
            seconds = time.perf_counter() - started
        engine = create_engine(db.url)
        with engine.connect() as conn:
            by_node: dict[str, int] = dict(
                conn.execute(
                    text(
                        "SELECT split_part(claimed_by, '-', 1), count(*) FROM request "
                        "WHERE batch_id = :b GROUP BY 1"
                    ),
                    {"b": batch_id},
                ).all()
            )
        engine.dispose()
        return {
            "setup": setup,
            "nodes": nodes,
            "threads_per_node": threads,
            "status": b["status"],
            "seconds": round(seconds, 2),
            "lines_per_s": round(len(lines) / seconds, 2),
            "output_tokens": b["usage"]["output_tokens"],
            "lines_by_node": by_node,
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        os.environ.pop("BATCHYARD_THREADS", None)
        os.environ.pop("BATCHYARD_NODE_NAME", None)
        tmp.cleanup()
        db.drop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--server",
        default=os.environ.get("BATCHYARD_TEST_DATABASE_URL") or DEFAULT_SERVER,
        help="a PostgreSQL URL whose user may CREATE DATABASE (one fresh database per round)",
    )
    p.add_argument("--lines", type=int, default=64, help="lines in the batch")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each line")
    p.add_argument("--parallel", type=int, default=4, help="engine slots per node")
    p.add_argument(
        "--threads-per-node",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="CPU threads of each node in `one` and `two` (default: half the cores)",
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds of each set-up, interleaved")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)

    lines = [
        chat_line(f"l{i}", f"Write a line about the number {i}.", args.max_tokens)
        for i in range(args.lines)
    ]
    setups = {
        "one": (1, args.threads_per_node),
        "two": (2, args.threads_per_node),
        "one-big": (1, 2 * args.threads_per_node),
    }
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for setup, (nodes, threads) in setups.items():
            result = one_round(args, setup, nodes, threads, lines)
            rounds.append(result)
            print(f"round {r + 1}: {json.dumps(result)}", flush=True)
    medians = {
        s: round(statistics.median(x["lines_per_s"] for x in rounds if x["setup"] == s), 2)
        for s in setups
    }
    summary = {
        "lines": args.lines,
        "max_tokens": args.max_tokens,
        "threads_per_node": args.threads_per_node,
        "median_lines_per_s": medians,
        "two_over_one": round(medians["two"] / medians["one"], 3),
        "two_over_one_big": round(medians["two"] / medians["one-big"], 3),
        "rounds": rounds,
    }
    print(
        f"lines/s (medians of {args.rounds} interleaved rounds): one node {medians['one']}, "
        f"two nodes {medians['two']}, one node with both nodes' threads {medians['one-big']}; "
        f"two/one {summary['two_over_one']}, two/one-big {summary['two_over_one_big']}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    ok = all(x["status"] == "completed" for x in rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
