"""How far the projected finish times are off: a few batches of two owners on one node.

A `batchyard serve` (two API keys, so two owners) feeds harness/upstream.py's fixed-latency
upstream (--latency-ms, --concurrency), or with --embedded the embedded default model
(short answers, max_tokens 8). Owner A starts a big batch; --gap seconds on, owner B a small
one; as long again, owner A a second one. Each batch's projection is sampled by the runner;
at each completion the server logs `projection_error first=... half=...` (projected minus
actual finish, and how far ahead the projection looked). This prints them as a table, with
the error as a share of the time the projection looked ahead.

    python bench/projection.py                          # 3 batches: 6,000 / 600 / 2,000 lines
    python bench/projection.py --embedded --lines 96,16,32 --gap 10

Figures are in bench/README.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from openai import OpenAI  # noqa: E402

from bench.fleet import jsonl  # noqa: E402
from harness.live import start_server, stop_process, stop_server  # noqa: E402
from harness.upstream import MODEL, start_upstream  # noqa: E402

ERROR = re.compile(r"batch=(\S+) projection_error first=(\S+) half=(\S+)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", default="6000,600,2000", help="the three batches' lines")
    p.add_argument("--gap", type=float, default=5.0, help="seconds between two creates")
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--embedded", action="store_true", help="the embedded model, no upstream")
    p.add_argument("--trace", action="store_true", help="print each projection as it moves")
    args = p.parse_args(argv)
    sizes = [int(n) for n in args.lines.split(",")]
    proc = None
    work = Path(tempfile.mkdtemp(prefix="bench-projection-"))
    if args.embedded:
        model, engine_args = "default", []
    else:
        proc, upstream = start_upstream(args.latency_ms)
        model = MODEL
        engine_args = [
            "--no-embedded",
            "--engine",
            f"up=openai:{upstream}/v1,models={MODEL},concurrency={args.concurrency}",
        ]
    server = start_server(
        work / "data",
        work / "server.log",
        args=[*engine_args, "--api-key", "key-a", "--api-key", "key-b"],
        timeout=300,
    )
    try:
        clients = {
            k: OpenAI(base_url=server.api, api_key=k, max_retries=0, timeout=120)
            for k in ("key-a", "key-b")
        }
        plan = list(zip(["key-a", "key-b", "key-a"], sizes, strict=False))
        ids: dict[str, tuple[str, int, float]] = {}
        for i, (key, n) in enumerate(plan):
            if i:
                time.sleep(args.gap)
            c = clients[key]
            body = [
                {
                    "model": model,
                    "max_tokens": 8,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"Say {j}."}],
                }
                for j in range(n)
            ]
            f = c.files.create(file=("in.jsonl", jsonl(body)), purpose="batch")
            b = c.batches.create(
                input_file_id=f.id,
                endpoint="/v1/chat/completions",
                completion_window="1h",  # type: ignore[arg-type]
            )
            ids[b.id] = (key, n, time.time())
        while True:
            states = {
                bid: clients[key].batches.retrieve(bid).status for bid, (key, _, _) in ids.items()
            }
            if args.trace:
                _trace(server.url, ids)
            if all(s in ("completed", "failed", "expired", "cancelled") for s in states.values()):
                break
            time.sleep(0.5)
        time.sleep(0.5)
        found = {m.group(1): (m.group(2), m.group(3)) for m in ERROR.finditer(server.log())}
        print(
            f"{'batch':<32} {'owner':<6} {'lines':>6} {'run s':>7}  "
            f"{'first: off s / ahead s':>24}  {'half: off s / ahead s':>24}"
        )
        for bid, (key, n, created) in ids.items():
            b = clients[key].batches.retrieve(bid)
            run = (b.finalizing_at or b.completed_at or created) - created
            e = found.get(bid)
            if e is None:
                print(f"{bid:<32} {key:<6} {n:>6} {run:>7.0f}  (no projection logged)")
                continue
            print(f"{bid:<32} {key:<6} {n:>6} {run:>7.0f}  {_cell(e[0]):>24}  {_cell(e[1]):>24}")
    finally:
        stop_server(server)
        if proc is not None:
            stop_process(proc)
    return 0


def _trace(url: str, ids: dict[str, tuple[str, int, float]]) -> None:
    """One line: each batch's lines done and projected seconds left, from /metrics."""
    page = httpx.get(url + "/metrics", headers={"Authorization": "Bearer key-a"}).text
    finish = dict(
        re.findall(r'batchyard_batch_projected_finish_seconds\{batch="(\S+)"\} (\S+)', page)
    )
    now = time.time()
    cells = [
        f"{bid[-4:]}: {float(finish[bid]) - now:6.1f}s" if bid in finish else f"{bid[-4:]}:      -"
        for bid in ids
    ]
    print(f"t={now % 1000:7.1f}  " + "  ".join(cells), flush=True)


def _cell(logged: str) -> str:
    """'+2.5s/30s' -> '+2.5 / 30 (+8%)'; '-' (no projection) stays."""
    if logged == "-":
        return "-"
    off, ahead = (float(x.rstrip("s")) for x in logged.split("/"))
    pct = f" ({100 * off / ahead:+.0f}%)" if ahead > 0 else ""
    return f"{off:+.1f} / {ahead:.0f}{pct}"


if __name__ == "__main__":
    raise SystemExit(main())
