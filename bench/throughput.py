"""Throughput benchmark: batchyard's continuous batching against a sequential llama-cpp-python loop.

The same N chat lines (temperature 0) run through
  (a)  batchyard end to end: `python -m app.cli serve` as a subprocess, the openai SDK
       uploads a batch file, creates a batch and polls it to completion;
  (a') the LlamaEngine directly: every line submitted at once, batch priority;
  (b)  a sequential loop of llama-cpp-python's high-level `Llama.create_chat_completion`.
(a or a') and (b) alternate in one run, so machine noise hits both alike. Then a table of
generated tokens/s by --parallel, through the engine directly.

    python bench/throughput.py --lines 32 --max-tokens 32 --parallel-list 1,8,16
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a haiku about the sea.",
    "How do airplanes stay in the air?",
    "What is 17 times 23?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Give me one tip for learning Python.",
    "What causes the seasons on Earth?",
    "Describe a cat to someone who has never seen one.",
    "What is the difference between weather and climate?",
    "Suggest a name for a bakery.",
    "How does a refrigerator keep food cold?",
    "What is a prime number?",
    "Write a short apology for being late.",
    "Why do we need sleep?",
    "List three uses of a paperclip.",
    "What is the boiling point of water at sea level?",
    "Explain what a database is.",
    "How do bees make honey?",
    "What is gravity?",
    "Give a synonym for happy.",
    "Summarize the story of Cinderella in two sentences.",
    "What does a compiler do?",
    "How many legs does a spider have?",
    "Why is exercise good for you?",
    "What is the tallest mountain in the world?",
    "Write a slogan for a coffee shop.",
    "How do magnets work?",
    "What is the largest ocean?",
    "Explain recursion to a child.",
    "What are clouds made of?",
]


def lines(n: int, max_tokens: int) -> list[dict[str, Any]]:
    """N distinct chat bodies: the questions cycle, each repeat with its own variant tag."""
    bodies = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)]
        variant = i // len(QUESTIONS)
        text = q if variant == 0 else f"{q} (variant {variant})"
        bodies.append(
            {
                # Any name: batchyard serves its own model, as an OpenAI script expects.
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
        )
    return bodies


@contextlib.contextmanager
def same_cpu_buffers(model: Path, threads: int) -> Iterator[None]:
    """Load the baseline with the CPU buffer types the engine picks (app/engine/cpu_check.py)."""
    import llama_cpp.llama_cpp as bindings  # the module llama_cpp.llama's Llama calls

    from app.config import Settings
    from app.engine.cpu_check import extra_buffers

    settings = Settings.load()
    extra, _ = extra_buffers(model, threads, settings.cpu_extra_buffers, settings.cache_path)
    original = bindings.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = extra
        return p

    bindings.llama_model_default_params = params
    try:
        yield
    finally:
        bindings.llama_model_default_params = original


def threads_for(requested: int) -> int:
    """What the engine will use for 0 (all cores), computed without importing llama_cpp here."""
    if requested > 0:
        return requested
    return max(1, len(os.sched_getaffinity(0)))


def isolated(
    kind: str, args: argparse.Namespace, parallel: int = 1, prefix_cache: bool = True
) -> tuple[int, float]:
    """Run one measurement in a fresh process.

    Two llama.cpp users in one process share libgomp, which then counts more threads than
    cores and throttles its spinning: an engine measured after the high-level Llama ran
    3x slower (34 vs 97 tok/s at parallel 1). A process each keeps them apart.
    """
    cmd = [sys.executable, __file__, "--worker", kind, "--lines", str(args.lines),
           "--max-tokens", str(args.max_tokens), "--ctx-size", str(args.ctx_size),
           "--threads", str(args.threads), "--parallel", str(parallel),
           "--prefix-cache", "1" if prefix_cache else "0", "--kv-cache-type", args.kv_cache_type]  # fmt: skip
    if args.model:
        cmd += ["--model", args.model]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not result:
        raise RuntimeError(f"{kind} measurement failed:\n{out.stdout}\n{out.stderr}")
    _, tokens, seconds = result[-1].split()
    return int(tokens), float(seconds)


def run_sequential(
    model: Path, bodies: list[dict[str, Any]], ctx: int, threads: int, kv: str
) -> tuple[int, float]:
    """(b): one request after another through the high-level API."""
    from llama_cpp import Llama

    from app.engine.native import KV_GGML_TYPES, kv_needs_flash_attention

    kv_type = KV_GGML_TYPES[kv]
    with same_cpu_buffers(model, threads):
        # The engine's llama.cpp settings: KV cache type, and flash attention where it needs it.
        llm = Llama(
            str(model),
            n_ctx=ctx,
            n_threads=threads,
            n_threads_batch=threads,
            type_k=kv_type,
            type_v=kv_type,
            flash_attn=kv_needs_flash_attention(kv),
            verbose=False,
        )
    tokens = 0
    start = time.perf_counter()
    for body in bodies:
        out = llm.create_chat_completion(
            messages=body["messages"], max_tokens=body["max_tokens"], temperature=0.0
        )
        tokens += out["usage"]["completion_tokens"]
    elapsed = time.perf_counter() - start
    llm.close()
    return tokens, elapsed


def run_engine(
    model: Path,
    bodies: list[dict[str, Any]],
    parallel: int,
    ctx: int,
    threads: int,
    kv: str,
    prefix_cache: bool = True,
) -> tuple[int, float]:
    """(a'): every line submitted at once to the LlamaEngine."""
    from app.config import Settings
    from app.engine.base import CHAT, Priority
    from app.engine.llama import load_engine

    # Settings.load, so BATCHYARD_* variables (BATCHYARD_CPU_EXTRA_BUFFERS) apply as in a server.
    engine = load_engine(
        Settings.load(
            {
                "model": str(model),
                "parallel": parallel,
                "ctx_size": ctx,
                "threads": threads,
                "kv_cache_type": kv,
                "prefix_cache": prefix_cache,
            }
        )
    )
    try:
        start = time.perf_counter()
        futures = [engine.submit(CHAT, body, priority=Priority.BATCH) for body in bodies]
        tokens = sum(f.result()["usage"]["completion_tokens"] for f in futures)
        return tokens, time.perf_counter() - start
    finally:
        engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(
    model: Path, bodies: list[dict[str, Any]], parallel: int, ctx: int, threads: int, kv: str
) -> tuple[int, float]:
    """(a): batchyard end to end through the openai SDK's Files and Batch calls."""
    from openai import OpenAI

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "app.cli", "serve", "--no-browser", "--port", str(port), "--data-dir", tmp,
               "--parallel", str(parallel), "--ctx-size", str(ctx), "--model", str(model),
               "--kv-cache-type", kv]  # fmt: skip
        if threads:
            cmd += ["--threads", str(threads)]
        server = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            base = f"http://127.0.0.1:{port}/v1"
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"{base}/models", timeout=2)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("batchyard serve did not come up") from None
                    time.sleep(0.3)
            client = OpenAI(base_url=base, api_key=os.environ.get("BATCHYARD_BENCH_KEY", "bench"))
            jsonl = "".join(
                json.dumps(
                    {
                        "custom_id": f"line-{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": b,
                    }
                )
                + "\n"
                for i, b in enumerate(bodies)
            )
            upload = client.files.create(
                file=("bench.jsonl", io.BytesIO(jsonl.encode())), purpose="batch"
            )
            start = time.perf_counter()
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while batch.status not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.2)
                batch = client.batches.retrieve(batch.id)
            elapsed = time.perf_counter() - start
            if batch.status != "completed" or not batch.output_file_id:
                errors = batch.errors.data[:3] if batch.errors and batch.errors.data else None
                raise RuntimeError(f"batch ended {batch.status}: {errors}")
            output = client.files.content(batch.output_file_id).text
            tokens = sum(
                json.loads(line)["response"]["body"]["usage"]["completion_tokens"]
                for line in output.splitlines()
                if line.strip()
            )
            return tokens, elapsed
        finally:
            server.terminate()
            server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    from app.config import Settings, default_model_path
    from app.engine.cpu_check import extra_buffers

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=256, help="chat lines per run (default 256)")
    parser.add_argument(
        "--max-tokens", type=int, default=64, help="max_tokens per line (default 64)"
    )
    parser.add_argument(
        "--parallel", type=int, default=32, help="slots for (a)/(a') (default 32, the CPU default)"
    )
    parser.add_argument(
        "--parallel-list", default="1,4,8,16,32", help="slots for the table (default 1,4,8,16,32)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternating a/b rounds; medians are reported"
    )
    parser.add_argument("--mode", choices=("engine", "server"), default="engine",
                        help="(a') the engine directly (default) or (a) `batchyard serve` end to end")  # fmt: skip
    parser.add_argument("--ctx-size", type=int, default=512, help="context per slot (default 512)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads, 0 = all cores")
    parser.add_argument("--kv-cache-type", default=Settings.kv_cache_type,
                        help=f"KV cache type for both sides (default {Settings.kv_cache_type})")  # fmt: skip
    parser.add_argument("--model", default="", help="a .gguf; default the embedded SmolLM2")
    parser.add_argument(
        "--no-table", action="store_true", help="skip the tokens/s by parallel table"
    )
    parser.add_argument("--worker", choices=("engine", "sequential"), help=argparse.SUPPRESS)
    parser.add_argument("--prefix-cache", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    model = Path(args.model) if args.model else default_model_path()
    threads = threads_for(args.threads)
    bodies = lines(args.lines, args.max_tokens)
    if args.worker:  # one measurement, in this fresh process
        if args.worker == "engine":
            tok, sec = run_engine(
                model, bodies, args.parallel, args.ctx_size, threads, args.kv_cache_type,
                bool(args.prefix_cache),
            )  # fmt: skip
        else:
            tok, sec = run_sequential(model, bodies, args.ctx_size, threads, args.kv_cache_type)
        print(f"RESULT {tok} {sec}")
        return 0
    label = "a  batchyard serve" if args.mode == "server" else "a' LlamaEngine"
    settings = Settings.load()
    extra, _ = extra_buffers(model, threads, settings.cpu_extra_buffers, settings.cache_path)
    print(
        f"model={model.name} lines={args.lines} max_tokens={args.max_tokens} threads={threads} "
        f"ctx/slot={args.ctx_size} kv={args.kv_cache_type} "
        f"cpu_extra_buffers={'on' if extra else 'off'}"
    )

    rates_a, rates_b = [], []
    for r in range(args.rounds):
        if args.mode == "server":
            tok, sec = run_server(
                model, bodies, args.parallel, args.ctx_size, threads, args.kv_cache_type
            )
        else:
            tok, sec = isolated("engine", args, args.parallel)
        rates_a.append(tok / sec)
        print(
            f"round {r + 1}: ({label}, parallel {args.parallel}) {tok} tokens in {sec:.1f}s = {tok / sec:.1f} tok/s",
            flush=True,
        )
        tok, sec = isolated("sequential", args)
        rates_b.append(tok / sec)
        print(
            f"round {r + 1}: (b  sequential Llama)        {tok} tokens in {sec:.1f}s = {tok / sec:.1f} tok/s",
            flush=True,
        )
    a, b = statistics.median(rates_a), statistics.median(rates_b)
    print(f"\nmedian tok/s: a={a:.1f}  b={b:.1f}  ratio a/b = {a / b:.2f}")

    if not args.no_table:
        # Prefix cache on and off side by side: the gain of not recomputing shared prefixes.
        print("\nparallel  tokens  tok/s cache on  tok/s cache off   (LlamaEngine directly)")
        for p in [int(x) for x in args.parallel_list.split(",") if x.strip()]:
            tok, sec = isolated("engine", args, p, True)
            _, sec_off = isolated("engine", args, p, False)
            print(f"{p:>8}  {tok:>6}  {tok / sec:>14.1f}  {tok / sec_off:>15.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
