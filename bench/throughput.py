"""Throughput benchmark: batchyard against llama.cpp's own llama-server on batch workloads.

Four workloads (--workload), each a list of batch lines:
  short   chat lines of about 45 prompt tokens, 48 tokens out (256 lines)
  long    chat lines of about 320-token distinct prompts, 16 tokens out (128 lines)
  embed   embedding lines of about 43 tokens each (512 lines)
  shared  the batch most users send (classification, extraction): every line the same system
          prompt of about 900 tokens of instructions and a short distinct input, 4 tokens out
          (128 lines; 1,280 tokens of context per slot; llama-server fed `slots` at a time)
  tiny    the short lines on a random-weight model of one layer with SmolLM2's width (the
          engine's own cost per step shows; written once into ~/.cache/batchyard/bench-models)
  shared4 four such blocks, each with its own rules, a quarter of the lines each, the lines
          shuffled (256 lines): a file that mixes tasks
run side by side, in alternating rounds (A, B, A, B) so machine noise hits both alike, through
  (a)  batchyard end to end: `python -m app.cli serve` as a subprocess, the openai SDK uploads
       a batch file, creates a batch and polls it to completion (`--batchyard engine`: the
       LlamaEngine directly instead, every line submitted at once);
  (b)  llama-server (bench/build_llama_server.sh: the same llama.cpp sources, the same header
       fix) with the same slot count, tuned (`-fa on -ctk q8_0 -ctv q8_0`; embeddings
       `--embeddings --pooling mean` with --server-ub), every line its own HTTP request,
       `2 x slots` of them in flight (`slots` for shared);
  (c)  optionally (--old SRC) batchyard from another checkout, e.g. the commit before a change;
  (d)  optionally (--sequential) a sequential llama-cpp-python loop (`Llama`, one line after
       another), the baseline this script always had;
then `llama-batched-bench` at the same batch size, whose prompt (S_PP) and generation (S_TG)
tokens/s are the ceiling: the time the workload's prompt and output tokens take at those
rates. Ratios are llama-server's time over batchyard's (above 1: batchyard is faster),
the median over rounds of each round's ratio; every other round runs the sides in reverse,
and each row carries the 1-minute load average as it ended.

    bash bench/build_llama_server.sh            # once; prints the binary dir
    python bench/throughput.py --workload long --lines 64 --rounds 2
    python bench/throughput.py --workload shared --no-ceiling
`--n-gpu-layers -1` offloads every layer on both sides (bench/gpu.sh on a GPU machine).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.live import free_port  # noqa: E402
from harness.waiting import until  # noqa: E402

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
WORDS = (
    "river market winter engine garden letter signal harbor planet village copper meadow "
    "lantern journey battery canyon orchard bridge compass thunder marble festival library "
    "island pepper tunnel violin glacier harvest rocket castle forest museum ladder candle "
    "desert falcon silver anchor blanket cotton dragon ember feather galaxy hammer jungle"
).split()


@dataclass(frozen=True)
class Workload:
    endpoint: str
    lines: int
    max_tokens: int  # 0 for embeddings
    ctx_size: int = 512  # context per slot
    in_flight_per_slot: int = 2  # llama-server's requests in flight, per slot
    model: str = ""  # "tiny": the one-layer random-weight model (tiny_model); "" the default


WORKLOADS = {
    "short": Workload("/v1/chat/completions", 256, 48),
    "long": Workload("/v1/chat/completions", 128, 16),
    "embed": Workload("/v1/embeddings", 512, 0),
    "shared": Workload("/v1/chat/completions", 128, 4, ctx_size=1280, in_flight_per_slot=1),
    "tiny": Workload("/v1/chat/completions", 256, 48, model="tiny"),
    "shared4": Workload("/v1/chat/completions", 256, 4, ctx_size=1280, in_flight_per_slot=1),
}
CATEGORIES = ("billing", "shipping", "returns", "account", "product", "other")


def shared_instructions(block: int = 0) -> str:
    """The shared workload's system prompt: about 900 tokens of rules, the same on every line
    (shared4: `block` 0-3, four different sets of rules)."""
    rng = random.Random(900 + block)
    rules = [
        f"Rule {n}: when a ticket mentions {_words(rng, 2)} or {_words(rng, 2)}, weigh "
        f"{CATEGORIES[n % len(CATEGORIES)]} first, unless it also names {_words(rng, 3)}."
        for n in range(1, 31)
    ]
    return (
        "You sort customer support tickets into exactly one category: "
        + ", ".join(CATEGORIES)
        + ". Read the rules below, then answer with the category's name only.\n"
        + "\n".join(rules)
    )


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


SHARED_BLOCKS = [shared_instructions(b) for b in range(4)]


def shared_blocks(workload: str, n: int) -> list[int]:
    """Which block each line of a shared workload carries: shared4's are shuffled."""
    if workload != "shared4":
        return [0] * n
    blocks = [i % 4 for i in range(n)]
    random.Random(4).shuffle(blocks)
    return blocks


def bodies_for(workload: str, n: int, max_tokens: int) -> list[dict[str, Any]]:
    """N distinct request bodies of the workload (deterministic)."""
    out: list[dict[str, Any]] = []
    blocks = shared_blocks(workload, n)
    for i in range(n):
        rng = random.Random(i)
        if workload == "embed":
            # About 43 tokens: an id and 39 words, distinct from the first token on.
            out.append({"model": "text-embedding-3-small", "input": f"{i}: {_words(rng, 39)}"})
            continue
        if workload in ("shared", "shared4"):
            out.append(
                {
                    "model": "gpt-4o-mini",
                    "messages": [
                        {"role": "system", "content": SHARED_BLOCKS[blocks[i]]},
                        {"role": "user", "content": f"Ticket {i}: {_words(rng, 12)}"},
                    ],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
            )
            continue
        if workload in ("short", "tiny"):
            q = QUESTIONS[i % len(QUESTIONS)]
            variant = i // len(QUESTIONS)
            text = q if variant == 0 else f"{q} (variant {variant})"
        else:  # long: about 320 prompt tokens with the chat template, distinct from the start
            text = f"Note {i}. {_words(rng, 270)}\nWhich word comes up most often above?"
        out.append(
            {
                "model": "gpt-4o-mini",  # any name: both servers serve their one model
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
        )
    return out


@dataclass
class Result:
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    cpu_seconds: float = 0.0  # the server process's user + system time over the run
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache (usage's cached_tokens)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (Linux). On a loaded machine the wall time
    swings with the neighbours; the CPU time a side spends on the same work swings less."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    """The machine's 1-minute load average when a side ends (/proc/loadavg; "-" elsewhere):
    beside each round's row, so a noisy machine shows."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "-"


def cached_of(body: dict[str, Any]) -> int:
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def tokens_of(body: dict[str, Any]) -> tuple[int, int]:
    usage = body.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


# ------------------------------------------------------------------------------ batchyard


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 180) -> None:
    """Until `url` answers 200; a RuntimeError if `proc` exits or `timeout` passes first."""

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)

    try:
        until(up, timeout, what, poll=0.3, ignoring=(OSError,))
    except AssertionError:
        raise RuntimeError(f"{what} did not come up within {timeout:.0f} s") from None


def run_batchyard(
    src: Path, model: Path, endpoint: str, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> Result:
    """(a)/(c): `batchyard serve` from checkout `src`, end to end through the openai SDK."""
    with tempfile.TemporaryDirectory() as tmp:
        serve_args = ["--data-dir", tmp, "--parallel", str(args.parallel), "--ctx-size",
                      str(args.ctx_size), "--model", str(model), "--kv-cache-type",
                      args.kv_cache_type, "--threads", str(args.threads), "--n-gpu-layers",
                      str(args.n_gpu_layers),
                      # llama-server runs at normal priority; on a CPU batchyard's default is
                      # the lowest (SCHED_IDLE), which any other load on the machine starves.
                      "--engine-priority", "normal"]  # fmt: skip
        key = os.environ.get("BATCHYARD_BENCH_KEY", "bench")
        return through_batchyard(
            src, serve_args, Path(tmp) / "serve.log", endpoint, bodies, api_key=key
        )


def through_batchyard(
    src: Path,
    serve_args: list[str],
    log: Path,
    endpoint: str,
    bodies: list[dict[str, Any]],
    *,
    api_key: str = "bench",
) -> Result:
    """`batchyard serve SERVE_ARGS` from checkout `src` on a free port (its output in `log`),
    and the bodies as one batch through the openai SDK, from create to completed: the wall
    time, the tokens its output counts, and the server's CPU seconds. Stopped afterwards."""
    from openai import OpenAI

    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--no-browser", "--port", str(port)]
    # The checkout first; what PYTHONPATH held stays (bench/gpu.sh's dependencies live there).
    path = os.pathsep.join(x for x in (str(src), os.environ.get("PYTHONPATH", "")) if x)
    with open(log, "wb") as logf:
        server = subprocess.Popen(
            [*cmd, *serve_args],
            cwd=src,
            env={**os.environ, "PYTHONPATH": path},
            stdout=logf,
            stderr=logf,
        )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        wait_up(f"{base}/models", server, "batchyard serve")
        client = OpenAI(base_url=base, api_key=api_key)
        jsonl = "".join(
            json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": endpoint, "body": b})
            + "\n"
            for i, b in enumerate(bodies)
        )
        upload = client.files.create(
            file=("bench.jsonl", io.BytesIO(jsonl.encode())), purpose="batch"
        )
        start, cpu = time.perf_counter(), cpu_seconds(server.pid)
        batch = client.batches.create(
            input_file_id=upload.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h",
        )
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(0.1)
            batch = client.batches.retrieve(batch.id)
        elapsed, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu
        counts = batch.request_counts
        if batch.status != "completed" or not batch.output_file_id or (counts and counts.failed):
            errors = batch.errors.data[:3] if batch.errors and batch.errors.data else None
            raise RuntimeError(f"batch ended {batch.status}, {counts}: {errors}")
        prompt = completion = cached = 0
        for line in client.files.content(batch.output_file_id).text.splitlines():
            if line.strip():
                body = json.loads(line)["response"]["body"]
                p, c = tokens_of(body)
                prompt, completion, cached = prompt + p, completion + c, cached + cached_of(body)
        return Result(elapsed, prompt, completion, cpu, cached)
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_engine(
    model: Path, endpoint: str, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> Result:
    """(a'): every line submitted at once to the LlamaEngine, in this (worker) process."""
    from app.config import Settings
    from app.engine.base import Priority
    from app.engine.llama.loading import load_engine

    trace = None
    if args.trace:
        from bench.waves import Trace

        trace = Trace()
        trace.install_params(kv_unified=args.kv_unified)
    # Settings.load, so BATCHYARD_* variables (BATCHYARD_CPU_EXTRA_BUFFERS) apply as in a server.
    engine = load_engine(
        Settings.load(
            {
                "model": str(model),
                "parallel": args.parallel,
                "ctx_size": args.ctx_size,
                "threads": args.threads,
                "kv_cache_type": args.kv_cache_type,
                "n_gpu_layers": args.n_gpu_layers,
            }
        )
    )
    if trace is not None:
        trace.attach(engine)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        futures = [engine.submit(endpoint, body, priority=Priority.BATCH) for body in bodies]
        answers = [f.result() for f in futures]
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        usages = [tokens_of(a) for a in answers]
        cached = sum(cached_of(a) for a in answers)
        if trace is not None:
            print(trace.summary(), flush=True)
        return Result(elapsed, sum(p for p, _ in usages), sum(c for _, c in usages), cpu, cached)
    finally:
        engine.close()


# --------------------------------------------------------------------------- llama-server


def llama_ngl(n_gpu_layers: int) -> str:
    """llama.cpp's tools take -ngl as a count, 'auto' (-1: as many as fit) or 'all'; batchyard's
    -1 means every layer, which is their 'all'."""
    return "all" if n_gpu_layers < 0 else str(n_gpu_layers)


def server_command(
    binary_dir: Path, model: Path, workload: str, args: argparse.Namespace
) -> list[str]:
    cmd = [str(binary_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
           "-np", str(args.parallel), "-c", str(args.parallel * args.ctx_size),
           "-t", str(args.threads), "-tb", str(args.threads), "--no-webui",
           "-ngl", llama_ngl(args.n_gpu_layers)]  # fmt: skip
    if workload == "embed":
        ub = str(args.server_ub)
        cmd += ["--embeddings", "--pooling", "mean", "-ub", ub, "-b", ub]
    else:
        cmd += ["-fa", "on", "-ctk", args.kv_cache_type, "-ctv", args.kv_cache_type]
    return cmd


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def llama_server(cmd: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """llama-server started by `cmd` (which listens on `port`), once its /health answers;
    stopped afterwards. Where it does not come up, the error holds the tail of its log."""
    with tempfile.TemporaryFile() as logf:
        server = subprocess.Popen(cmd, stdout=logf, stderr=logf)
        try:
            try:
                wait_up(f"http://127.0.0.1:{port}/health", server, "llama-server")
            except RuntimeError:
                logf.seek(0)
                raise RuntimeError(logf.read()[-3000:].decode(errors="replace")) from None
            yield server
        finally:
            server.terminate()
            server.wait(timeout=30)


def through_llama_server(
    cmd: list[str], port: int, endpoint: str, bodies: list[dict[str, Any]], in_flight: int
) -> Result:
    """Each body one request to llama-server's `endpoint`, `in_flight` at a time: the wall
    time, the tokens its answers count, and the server's CPU seconds."""
    with llama_server(cmd, port) as server:
        url = f"http://127.0.0.1:{port}{endpoint}"
        start, cpu = time.perf_counter(), cpu_seconds(server.pid)
        with ThreadPoolExecutor(in_flight) as pool:
            outs = list(pool.map(lambda b: post_json(url, b), bodies))
        elapsed, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu
    usages = [tokens_of(o) for o in outs]
    cached = sum(cached_of(o) for o in outs)
    return Result(elapsed, sum(p for p, _ in usages), sum(c for _, c in usages), cpu, cached)


def run_llama_server(
    binary_dir: Path,
    model: Path,
    workload: str,
    endpoint: str,
    bodies: list[dict[str, Any]],
    *,
    args: argparse.Namespace,
) -> Result:
    """(b): llama-server with the same slots; each line one request, the workload's
    in-flight count (2 x slots; slots for shared) at a time."""
    port = free_port()
    cmd = [*server_command(binary_dir, model, workload, args), "--port", str(port)]
    in_flight = WORKLOADS[workload].in_flight_per_slot * args.parallel
    return through_llama_server(cmd, port, endpoint, bodies, in_flight)


def batched_bench(
    binary_dir: Path, model: Path, prompt: int, gen: int, args: argparse.Namespace
) -> dict[str, float]:
    """llama-batched-bench at B = slots: its prompt and generation tokens/s (the ceiling)."""
    gen = max(gen, 1)
    cmd = [str(binary_dir / "llama-batched-bench"), "-m", str(model), "-c",
           str(args.parallel * (prompt + gen + 8)), "-b", "2048", "-ub", str(args.bench_ub),
           "-npp", str(prompt), "-ntg", str(gen), "-npl", str(args.parallel), "-t",
           str(args.threads), "-fa", "on", "-ctk", args.kv_cache_type, "-ctv",
           args.kv_cache_type, "-ngl", llama_ngl(args.n_gpu_layers), "--output-format", "jsonl"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    if not rows:
        raise RuntimeError(f"llama-batched-bench failed:\n{out.stderr[-2000:]}")
    return rows[-1]


# ----------------------------------------------------------------------------- sequential


@contextlib.contextmanager
def same_cpu_buffers(model: Path, threads: int) -> Iterator[None]:
    """Load the baseline with the CPU buffer types the engine picks (app/toolchain/cpu_check.py)."""
    import llama_cpp.llama_cpp as bindings  # the module llama_cpp.llama's Llama calls

    from app.config import Settings
    from app.toolchain.cpu_check import extra_buffers

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


def run_sequential(
    model: Path, endpoint: str, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> Result:
    """(d): one line after another through llama-cpp-python's high-level API."""
    from llama_cpp import Llama

    from app.engine.llama.binding.native import KV_GGML_TYPES, kv_needs_flash_attention

    kv_type = KV_GGML_TYPES[args.kv_cache_type]
    embed = endpoint == "/v1/embeddings"
    with same_cpu_buffers(model, args.threads):
        # The engine's llama.cpp settings: KV cache type, and flash attention where it needs it.
        llm = Llama(
            str(model),
            n_ctx=args.ctx_size,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            type_k=kv_type,
            type_v=kv_type,
            flash_attn=kv_needs_flash_attention(args.kv_cache_type),
            embedding=embed,
            pooling_type=1 if embed else -1,  # LLAMA_POOLING_TYPE_MEAN
            verbose=False,
        )
    prompt = completion = 0
    start, cpu = time.perf_counter(), time.process_time()
    for body in bodies:
        if embed:
            out: Any = llm.create_embedding(body["input"])
        else:
            out = llm.create_chat_completion(
                messages=body["messages"], max_tokens=body["max_tokens"], temperature=0.0
            )
        p, c = tokens_of(out)
        prompt, completion = prompt + p, completion + c
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    llm.close()
    return Result(elapsed, prompt, completion, cpu)


def isolated(kind: str, argv: list[str]) -> Result:
    """One in-process measurement (engine, sequential) in a fresh process.

    Two llama.cpp users in one process share libgomp, which then counts more threads than
    cores and throttles its spinning: an engine measured after the high-level Llama ran
    3x slower (34 vs 97 tok/s at parallel 1). A process each keeps them apart.
    """
    cmd = [sys.executable, __file__, *argv, "--worker", kind]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not result:
        raise RuntimeError(f"{kind} measurement failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    for line in out.stdout.splitlines():
        if line.startswith(("trace:", "  ")):
            print(line, flush=True)
    _, seconds, prompt, completion, cpu, cached = result[-1].split()
    return Result(float(seconds), int(prompt), int(completion), float(cpu), int(cached))


# ------------------------------------------------------------------------------------ main


def parse(argv: list[str] | None) -> argparse.Namespace:
    from app.config import Settings

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    parser.add_argument("--lines", type=int, default=0, help="lines (default: the workload's)")
    parser.add_argument("--max-tokens", type=int, default=-1, help="default: the workload's")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--parallel", type=int, default=32, help="slots on both sides (32)")
    parser.add_argument("--ctx-size", type=int, default=0,
                        help="context per slot (default: the workload's, 512; 1280 for shared)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="CPU threads, 0 = all cores")
    parser.add_argument("--n-gpu-layers", type=int, default=0,
                        help="layers offloaded to the GPU on every side (-1: all; default 0)")  # fmt: skip
    parser.add_argument("--kv-cache-type", default=Settings.kv_cache_type,
                        help=f"KV cache type for both sides (default {Settings.kv_cache_type})")  # fmt: skip
    parser.add_argument("--model", default="", help="a .gguf; default the embedded SmolLM2")
    parser.add_argument("--batchyard", choices=("serve", "engine"), default="serve",
                        help="(a) end to end (default) or (a') the LlamaEngine directly")  # fmt: skip
    parser.add_argument("--old", action="append", default=[],
                        help="(c) also run batchyard from this checkout (repeatable)")  # fmt: skip
    parser.add_argument("--sequential", action="store_true", help="(d) also the sequential loop")
    parser.add_argument("--no-server", action="store_true", help="skip (b) llama-server")
    parser.add_argument("--no-ceiling", action="store_true", help="skip llama-batched-bench")
    parser.add_argument("--server-bin", default="", help="llama-server's dir (default: build)")
    parser.add_argument("--server-ub", type=int, default=512,
                        help="llama-server's -ub/-b for embeddings (default 512, its best here)")  # fmt: skip
    parser.add_argument("--bench-ub", type=int, default=512, help="batched-bench -ub (512)")
    parser.add_argument("--trace", action="store_true",
                        help="with --batchyard engine: the engine's steps (bench/waves.py)")  # fmt: skip
    parser.add_argument("--kv-unified", action="store_true",
                        help="with --trace: one KV stream for all slots (a measurement)")  # fmt: skip
    parser.add_argument("--worker", choices=("engine", "sequential"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    spec = WORKLOADS[args.workload]
    args.lines = args.lines or spec.lines
    args.max_tokens = spec.max_tokens if args.max_tokens < 0 else args.max_tokens
    args.ctx_size = args.ctx_size or spec.ctx_size
    args.threads = args.threads or max(1, len(os.sched_getaffinity(0)))
    return args


def binaries(args: argparse.Namespace) -> Path:
    if args.server_bin:
        return Path(args.server_bin)
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "build_llama_server.sh"), sys.executable],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip().splitlines()[-1])


def tiny_model() -> Path:
    """SmolLM2-135M's shapes and tokenizer with one layer and random weights, written once."""
    from harness.random_models import Shapes, extract_tokenizer, write_model

    cache = Path.home() / ".cache" / "batchyard" / "bench-models"
    path = cache / "smollm2-1layer-random.gguf"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tok = cache / "smollm2-tokenizer.json.gz"
        if not tok.is_file():
            extract_tokenizer(tok)
        shapes = Shapes("smollm2-1layer-random", 1, 576, 1536, 9, 3, 100000.0)
        write_model(shapes, json.loads(gzip.decompress(tok.read_bytes())), path)
    return path


def main(argv: list[str] | None = None) -> int:
    from app.config import bundled_model_path

    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse(raw)
    spec = WORKLOADS[args.workload]
    if args.model:
        model = Path(args.model)
    else:
        model = tiny_model() if spec.model == "tiny" else bundled_model_path()
    bodies = bodies_for(args.workload, args.lines, args.max_tokens)
    if args.worker:  # one measurement, in this fresh process
        run = run_engine if args.worker == "engine" else run_sequential
        r = run(model, spec.endpoint, bodies, args)
        print(
            f"RESULT {r.seconds} {r.prompt_tokens} {r.completion_tokens} {r.cpu_seconds} "
            f"{r.cached_tokens}"
        )
        return 0

    bin_dir = None if args.no_server and args.no_ceiling else binaries(args)
    print(
        f"workload={args.workload} lines={args.lines} max_tokens={args.max_tokens} "
        f"model={model.name} slots={args.parallel} ctx/slot={args.ctx_size} "
        f"threads={args.threads} kv={args.kv_cache_type} n_gpu_layers={args.n_gpu_layers}",
        flush=True,
    )
    sides: dict[str, Any] = {}
    if args.batchyard == "serve":
        sides["batchyard"] = lambda: run_batchyard(ROOT, model, spec.endpoint, bodies, args)
    else:
        sides["batchyard"] = lambda: isolated("engine", raw)
    if not args.no_server:
        assert bin_dir is not None
        sides["llama-server"] = lambda: run_llama_server(
            bin_dir, model, args.workload, spec.endpoint, bodies, args=args
        )
    for old in args.old:
        src = Path(old).resolve()
        sides[f"old:{src.name}"] = lambda src=src: run_batchyard(
            src, model, spec.endpoint, bodies, args
        )
    if args.sequential:
        sides["sequential"] = lambda: isolated("sequential", raw)

    results: dict[str, list[Result]] = {name: [] for name in sides}
    for rnd in range(args.rounds):
        # Every other round in reverse (A B C, C B A): a side is not always first or last.
        order = list(sides.items())
        for name, run in order[::-1] if rnd % 2 else order:
            res = run()
            results[name].append(res)
            rate = res.completion_tokens if spec.max_tokens else res.prompt_tokens
            print(
                f"round {rnd + 1}: {name:<16} {res.seconds:7.1f} s  prompt {res.prompt_tokens:>7}"
                f"  out {res.completion_tokens:>6}  {rate / res.seconds:7.1f} "
                f"{'out' if spec.max_tokens else 'in'} tok/s  cpu {res.cpu_seconds:6.1f} s"
                f"  load {load_average()}",
                flush=True,
            )

    ceiling = ""
    if not args.no_ceiling:
        assert bin_dir is not None
        ceiling = ceiling_of(bin_dir, model, results["batchyard"][0], args)
    print_table(args, results, ceiling)
    return 0


def ceiling_of(bin_dir: Path, model: Path, first: Result, args: argparse.Namespace) -> str:
    """llama-batched-bench's speeds at the same shape, as the time this workload needs at
    least (printed, and returned for the table's last row)."""
    spec = WORKLOADS[args.workload]
    mean_prompt = max(1, round(first.prompt_tokens / args.lines))
    row = batched_bench(bin_dir, model, mean_prompt, args.max_tokens, args)
    pp, tg = float(row["speed_pp"]), float(row["speed_tg"])
    # The prompt tokens batchyard took from its cache need no computing: the ceiling
    # counts the rest (the shared workloads' blocks once, not once a line).
    uncached = first.prompt_tokens - first.cached_tokens
    ideal = uncached / pp + (first.completion_tokens / tg if spec.max_tokens else 0)
    print(
        f"\nllama-batched-bench B={args.parallel} PP={mean_prompt} TG={max(args.max_tokens, 1)}"
        f": S_PP {pp:.0f} tok/s, S_TG {tg:.0f} tok/s -> ceiling {ideal:.1f} s for this workload"
        f" ({uncached} uncached prompt tokens, {first.completion_tokens} out)"
    )
    return f"{ideal:.1f} s ({pp:.0f} pp / {tg:.0f} tg tok/s)"


def print_table(args: argparse.Namespace, results: dict[str, list[Result]], ceiling: str) -> None:
    """The sides' medians, and their ratios to batchyard's, as a Markdown table."""
    print(
        "\n| workload | side | median wall s | wall ratio | median CPU s | CPU ratio |"
        "\n|---|---|---|---|---|---|"
    )
    mine = results["batchyard"]

    def ratio(rs: list[Result], key: str) -> str:
        pairs = [(getattr(o, key), getattr(m, key)) for o, m in zip(rs, mine, strict=True)]
        if not all(b > 0 for _, b in pairs):
            return "-"
        return f"{statistics.median(a / b for a, b in pairs):.2f}x"

    for name, rs in results.items():
        print(
            f"| {args.workload} ({args.lines} lines) | {name} "
            f"| {statistics.median(x.seconds for x in rs):.1f} | {ratio(rs, 'seconds')} "
            f"| {statistics.median(x.cpu_seconds for x in rs):.1f} | {ratio(rs, 'cpu_seconds')} |"
        )
    if ceiling:
        print(f"| {args.workload} | ceiling (batched-bench) | {ceiling} | | | |")
    print("ratios: the other side's seconds over batchyard's, the median of the rounds' ratios")


if __name__ == "__main__":
    raise SystemExit(main())
