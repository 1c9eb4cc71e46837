"""Online latency: a chat completion on an idle server, and while a big batch runs.

Starts `batchyard serve` on a free port (the embedded default model unless --model),
times --requests synchronous `/v1/chat/completions` calls idle, then uploads and starts a
--lines batch and times the same calls while it runs, alternating nothing else. Prints the
median and p90 of each phase and the ratio busy/idle, then cancels the batch.

    python bench/online_latency.py --lines 500 --requests 10
    python bench/online_latency.py --shared --lines 1024   # lines sharing a ~900-token block

`--shared` gives every batch line throughput.py's shared system prompt (about 900 tokens of
rules) and a short question, 4 tokens out: the batch runs in the shared-prefix context,
whose prefill steps the online requests then wait beside.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from openai import OpenAI  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

from harness.live import start_server, stop_server  # noqa: E402

QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a color."}]


def timed_requests(client: OpenAI, n: int, max_tokens: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        client.chat.completions.create(
            model="any",
            messages=QUESTION,
            max_tokens=max_tokens,
            temperature=0,
        )
        out.append(time.perf_counter() - start)
    return out


def summary(name: str, xs: list[float]) -> float:
    xs = sorted(xs)
    median = statistics.median(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    print(f"{name:<28} median {median * 1000:7.0f} ms   p90 {p90 * 1000:7.0f} ms   (n={len(xs)})")
    return median


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lines", type=int, default=500, help="batch lines running in the background")
    p.add_argument("--batch-max-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=10, help="online requests per phase")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each online request")
    p.add_argument("--parallel", type=int, default=32, help="server slots (the CPU default: 32)")
    p.add_argument("--model", default="")
    p.add_argument("--shared", action="store_true", help="batch lines sharing a long block")
    args = p.parse_args(argv)
    from bench.throughput import shared_instructions

    block = shared_instructions(0) if args.shared else None
    batch_max_tokens = 4 if args.shared else args.batch_max_tokens

    extra = ["--model", args.model] if args.model else []
    extra += ["--parallel", str(args.parallel)]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(
            Path(tmp) / "data",
            Path(tmp) / "server.log",
            args=["--ctx-size", "1280" if args.shared else "512", *extra],
        )
        try:
            client = OpenAI(base_url=server.api, api_key="bench", max_retries=0)
            timed_requests(client, 2, args.max_tokens)  # warm up
            idle = timed_requests(client, args.requests, args.max_tokens)

            lines = "".join(
                json.dumps(
                    {
                        "custom_id": f"bg-{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {
                            "model": "any",
                            "messages": ([{"role": "system", "content": block}] if block else [])
                            + [{"role": "user", "content": f"Write a story about the number {i}."}],
                            "max_tokens": batch_max_tokens,
                            "temperature": 0,
                        },
                    }
                )
                + "\n"
                for i in range(args.lines)
            )
            f = client.files.create(file=("bg.jsonl", io.BytesIO(lines.encode())), purpose="batch")
            batch = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while (batch := client.batches.retrieve(batch.id)).status == "validating":
                time.sleep(0.2)
            time.sleep(2)  # let every slot fill with batch lines
            busy = timed_requests(client, args.requests, args.max_tokens)
            after = client.batches.retrieve(batch.id)
            client.batches.cancel(batch.id)

            print(f"server slots: {httpx.get(server.url + '/health').json()['slots']}")
            a = summary("idle", idle)
            b = summary(f"while a {args.lines}-line batch runs", busy)
            counts = after.request_counts
            done = counts.completed + counts.failed if counts else 0
            print(
                f"batch still {after.status} with {done}/{args.lines} lines done at the end of the busy phase"
            )
            print(f"ratio busy/idle (median): {b / a:.2f}")
        finally:
            stop_server(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
