"""Time `batchyard run` on N chat lines (default 100, max_tokens 16) on the default model.

    python bench/offline_run.py [--lines 100] [--max-tokens 16] [--parallel 32] [--exe batchyard]

Prints the wall time of the whole command (model load included), lines/s and generated
tokens/s, read back from the output file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOPICS = ["the sea", "a city", "winter", "bread", "music", "a river", "the moon", "a garden"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--parallel", type=int, default=32)
    p.add_argument("--ctx-size", type=int, default=512)
    p.add_argument("--exe", default=f"{shlex.quote(sys.executable)} -m app.cli")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        with open(src, "w") as fh:
            for i in range(args.lines):
                body = {
                    "model": "any",
                    "messages": [
                        {
                            "role": "user",
                            "content": f"Write one sentence about {TOPICS[i % len(TOPICS)]}.",
                        }
                    ],
                    "max_tokens": args.max_tokens,
                }
                fh.write(json.dumps({"custom_id": f"b-{i}", "method": "POST",
                                     "url": "/v1/chat/completions", "body": body}) + "\n")  # fmt: skip
        cmd = [*shlex.split(args.exe), "run", str(src), "-o", str(out),
               "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size)]  # fmt: skip
        t0 = time.monotonic()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return r.returncode
        results = [json.loads(x) for x in out.read_text().splitlines()]
        tokens = sum(x["response"]["body"]["usage"]["completion_tokens"] for x in results)
    print(
        f"{len(results)} lines, max_tokens {args.max_tokens}, --parallel {args.parallel}: "
        f"{wall:.1f}s wall, {len(results) / wall:.2f} lines/s, {tokens / wall:.1f} generated tok/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
