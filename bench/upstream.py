"""Lines per second through batchyard to an upstream, against a client sending the same lines
to the same upstream directly with the same concurrency, in one run.

The upstream is a second `batchyard serve` on the embedded model (served as `remote-smol`), or
`llama-server` when one is given (`--llama-server PATH` or the LLAMA_SERVER variable). The
front is `batchyard serve --no-embedded --engine up=openai:URL,concurrency=C`. Rounds alternate:
  (a) the N lines as one batch through the front's Files and Batch API, from the upload to the
      poll that sees `completed`;
  (b) the same N bodies POSTed straight to the upstream by httpx, C at a time.
It prints each round, the medians, and the ratio a/b (the goal is >= 0.95).

    python bench/upstream.py --lines 64 --max-tokens 16 --concurrency 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import bundled_model_path  # noqa: E402
from bench.fleet import cpu_seconds  # noqa: E402
from bench.throughput import bodies_for, wait_up  # noqa: E402
from harness.live import LiveServer, free_port, start_server, stop_server  # noqa: E402

MODEL = "remote-smol"
CHAT = "/v1/chat/completions"


def start_llama_server(binary: str, model: Path, parallel: int, log: Path) -> LiveServer:
    port = free_port()
    cmd = [binary, "-m", str(model), "--port", str(port), "-np", str(parallel)]
    cmd += ["-c", str(512 * parallel), "--alias", MODEL]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_up(f"http://127.0.0.1:{port}/health", proc, "llama-server", timeout=120)
    except RuntimeError as exc:
        proc.kill()
        raise SystemExit(f"{exc}:\n{log.read_text()}") from None
    return LiveServer(f"http://127.0.0.1:{port}", log.parent, proc, log)


def through_batchyard(front: str, bodies: list[dict[str, Any]]) -> float:
    """Seconds from the upload to the poll that sees the batch completed."""
    data = "".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": b}) + "\n"
        for i, b in enumerate(bodies)
    ).encode()
    with httpx.Client(base_url=front, timeout=60) as http:
        t0 = time.perf_counter()
        f = http.post(
            "/v1/files",
            files={"file": ("in.jsonl", data, "application/jsonl")},
            data={"purpose": "batch"},
        ).json()
        b = http.post(
            "/v1/batches",
            json={"input_file_id": f["id"], "endpoint": CHAT, "completion_window": "24h"},
        ).json()
        while True:
            b = http.get(f"/v1/batches/{b['id']}").json()
            if b["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            # Each poll costs the front CPU that the upstream shares on a small machine; at
            # 0.2 s the finish is seen 0.1 s late on average (under 1% of a round).
            time.sleep(0.2)
        seconds = time.perf_counter() - t0
    counts = b["request_counts"]
    if b["status"] != "completed" or counts["completed"] != len(bodies):
        raise SystemExit(f"the batch did not complete every line: {b}")
    return seconds


def direct(upstream: str, bodies: list[dict[str, Any]], concurrency: int) -> float:
    """Seconds for the bodies POSTed to the upstream, `concurrency` at a time."""

    async def go() -> float:
        gate = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=upstream, timeout=600, limits=limits) as http:

            async def one(body: dict[str, Any]) -> None:
                async with gate:
                    r = await http.post(CHAT, json=body)
                    r.raise_for_status()

            t0 = time.perf_counter()
            await asyncio.gather(*(one(b) for b in bodies))
            return time.perf_counter() - t0

    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8, help="the upstream's slots, and C")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating")
    p.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    args = p.parse_args()

    bodies = [{**b, "model": MODEL} for b in bodies_for("short", args.lines, args.max_tokens)]
    with tempfile.TemporaryDirectory(prefix="bench-upstream-") as tmp:
        root = Path(tmp)
        model = root / f"{MODEL}.gguf"
        model.symlink_to(bundled_model_path())
        if args.llama_server:
            upstream = start_llama_server(
                args.llama_server, model, args.concurrency, root / "llama-server.log"
            )
            kind = "llama-server"
        else:
            upstream = start_server(
                root / "up",
                root / "upstream.log",
                args=["--model", str(model), "--parallel", str(args.concurrency)],
            )
            kind = "batchyard"
        try:
            front = start_server(
                root / "front",
                root / "front.log",
                args=[
                    "--no-embedded",
                    "--engine",
                    f"up=openai:{upstream.api},concurrency={args.concurrency}",
                ],
            )
            try:
                print(
                    f"upstream: {kind}, {args.concurrency} slots; {args.lines} lines x "
                    f"{args.max_tokens} tokens; concurrency {args.concurrency}"
                )
                direct(upstream.url, bodies[: args.concurrency], args.concurrency)  # warm up
                through_batchyard(front.url, bodies[: args.concurrency])
                a: list[float] = []
                b: list[float] = []
                front_cpu: list[float] = []
                for r in range(args.rounds):
                    before = cpu_seconds(front.process.pid)
                    a.append(args.lines / through_batchyard(front.url, bodies))
                    front_cpu.append(cpu_seconds(front.process.pid) - before)
                    b.append(args.lines / direct(upstream.url, bodies, args.concurrency))
                    print(
                        f"round {r + 1}: through batchyard {a[-1]:.2f} lines/s, direct "
                        f"{b[-1]:.2f}; the front used {front_cpu[-1]:.2f} CPU s"
                    )
                ma, mb = statistics.median(a), statistics.median(b)
                print(f"median: through batchyard {ma:.2f} lines/s, direct {mb:.2f} lines/s")
                print(f"ratio through/direct: {ma / mb:.3f} (goal >= 0.95)")
                per_line = statistics.median(front_cpu) / args.lines * 1000
                print(f"the front's own CPU: {per_line:.1f} ms a line (median round)")
            finally:
                stop_server(front)
        finally:
            stop_server(upstream)


if __name__ == "__main__":
    main()
