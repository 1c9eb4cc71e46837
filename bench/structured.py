"""Structured-answer benchmark: batchyard's grammar (llguidance masks, forced tokens fed as
chunks) against the same lines without a schema, and against llama-server with json_schema.

Three workloads (--workload, default all), each --lines batch lines (256), greedy:
  sheet    a sheet's three columns (one of / boolean / text), as app/sheets/requests.py
           makes the json_schema, 48 tokens out at most
  extract  a nested extraction schema (objects in objects, an array with minItems, an
           integer with bounds), 96 tokens out at most
  tools    tool calls with tool_choice "required" (a function whose integer argument has
           bounds), 64 tokens out at most
run side by side in one run, in this order per workload, through
  (a)  batchyard end to end without the schema (the same messages; tools: the same tools
       block in the prompt, no grammar) -- bench/throughput.py's run_batchyard;
  (b)  batchyard with the schema;
  (c)  llama-server (bench/build_llama_server.sh: the same llama.cpp sources) with the
       same slots (-np), each line its own request with `response_format: json_schema`
       (tools: the call object's schema), 2 x slots in flight.
Reported per workload: walls, completion tokens/s, the server's CPU ms per completion
token, llama-server's wall over batchyard's with the schema (above 1: batchyard is faster),
batchyard's per-token wall with the schema over without, and, from batchyard's answers
replayed through their grammar (engine/structured.py) with the model's tokenizer, the share
of forced tokens (those `compute_ff_tokens` gives at each point: what the engine fed as
chunks; under greedy decoding the ids are the same, tests/integration/test_forced_tokens.py)
and the grammar's CPU per answer token (mask, its application to the logits, consume).

    bash bench/build_llama_server.sh            # once; prints the binary dir
    python bench/structured.py --lines 256
    python bench/structured.py --workload sheet --lines 64
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402
    Result,
    binaries,
    cpu_seconds,
    free_port,
    post_json,
    server_command,
    tokens_of,
    wait_up,
)

PRODUCTS = ["blender", "kettle", "desk lamp", "backpack", "phone case", "toaster", "headset",
            "water bottle", "office chair", "rice cooker", "bike light", "yoga mat"]  # fmt: skip
VERDICTS = ["works great", "broke after a week", "is fine for the price", "arrived late",
            "is louder than expected", "exceeded my hopes", "stopped charging", "feels cheap",
            "does the job", "is the best I have owned"]  # fmt: skip
PEOPLE = ["Ana Ruiz", "Ben Okafor", "Chen Wei", "Dana Levi", "Eva Novak", "Farid Haddad"]
CITIES = ["Lyon", "Porto", "Leeds", "Graz", "Turin", "Ghent", "Malmo", "Cork"]
NAME = {"type": "string", "maxLength": 24}


def closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


SHEET = closed(
    {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "mixed"]},
        "spam": {"type": "boolean"},
        "summary": {"type": "string"},
    }
)
EXTRACT = closed(
    {
        "customer": closed({"first": NAME, "last": NAME}),
        "city": NAME,
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": closed(
                {"product": NAME, "quantity": {"type": "integer", "minimum": 1, "maximum": 9}}
            ),
        },
        "urgent": {"type": "boolean"},
    }
)
RATE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "record_review",
        "description": "Record a product review's rating and the product.",
        "strict": True,
        "parameters": closed(
            {"product": NAME, "stars": {"type": "integer", "minimum": 1, "maximum": 5}}
        ),
    },
}
MAX_TOKENS = {"sheet": 48, "extract": 96, "tools": 64}
WORKLOADS = tuple(MAX_TOKENS)


def review(rng: random.Random, i: int) -> str:
    return f"Review {i}: the {rng.choice(PRODUCTS)} {rng.choice(VERDICTS)}."


def order(rng: random.Random, i: int) -> str:
    items = ", ".join(
        f"{rng.randint(1, 4)} x {rng.choice(PRODUCTS)}" for _ in range(rng.randint(1, 3))
    )
    urgent = "Please hurry." if rng.random() < 0.5 else "No rush."
    return (
        f"Order {i} from {rng.choice(PEOPLE)}, to be shipped to {rng.choice(CITIES)}: "
        f"{items}. {urgent}"
    )


def call_schema() -> dict[str, Any]:
    """The call object batchyard's tool grammar holds (oai/tools.py), for llama-server."""
    fn = RATE["function"]
    return closed({"name": {"const": fn["name"]}, "arguments": fn["parameters"]})


def tools_block() -> str:
    from app.engine.llama.jobs.oai import tools

    plan = tools.parse_tools({"tools": [RATE], "tool_choice": "required"})
    assert plan is not None
    return tools.system_block(plan)


def bodies_for(workload: str, n: int) -> dict[str, list[dict[str, Any]]]:
    """The lines of each side: 'plain' (no schema), 'schema' (batchyard's), 'server'
    (llama-server's: a json_schema response_format)."""
    rng = random.Random(7)
    out: dict[str, list[dict[str, Any]]] = {"plain": [], "schema": [], "server": []}
    for i in range(n):
        base = {"temperature": 0, "max_tokens": MAX_TOKENS[workload]}
        if workload == "tools":
            user = f"Record this review: {review(rng, i)}"
            messages = [{"role": "user", "content": user}]
            shown = [{"role": "system", "content": tools_block()}, *messages]
            out["plain"].append({**base, "messages": shown})
            out["schema"].append(
                {**base, "messages": messages, "tools": [RATE], "tool_choice": "required"}
            )
            schema = call_schema()
        else:
            if workload == "sheet":
                task, schema = f"Classify this review as JSON. {review(rng, i)}", SHEET
            else:
                task, schema = f"Extract the order as JSON. {order(rng, i)}", EXTRACT
            messages = [{"role": "user", "content": task}]
            shown = messages
            out["plain"].append({**base, "messages": messages})
            fmt = {"name": workload, "schema": schema, "strict": True}
            out["schema"].append(
                {**base, "messages": messages, "response_format": {"type": "json_schema", "json_schema": fmt}}
            )  # fmt: skip
        fmt = {"name": workload, "schema": schema, "strict": True}
        out["server"].append(
            {**base, "messages": shown, "response_format": {"type": "json_schema", "json_schema": fmt}}
        )  # fmt: skip
    return out


def run_batchyard_lines(
    model: Path, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> tuple[Result, list[str]]:
    """(a)/(b): bench/throughput.py's end-to-end run, keeping each answer's text (a
    call's arguments re-joined as the model wrote the call)."""
    from bench import throughput

    texts: list[str] = []
    real = throughput.tokens_of

    def keep(body: dict[str, Any]) -> tuple[int, int]:
        message = body["choices"][0]["message"]
        calls = message.get("tool_calls")
        if calls:
            fn = calls[0]["function"]
            texts.append(json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])}))
        else:
            texts.append(message.get("content") or "")
        return real(body)

    throughput.tokens_of = keep
    try:
        result = throughput.run_batchyard(
            ROOT, model, "/v1/chat/completions", [{"model": "bench", **b} for b in bodies], args
        )
    finally:
        throughput.tokens_of = real
    return result, texts


def run_server_lines(binary_dir: Path, model: Path, bodies: list[dict[str, Any]],
                     args: argparse.Namespace) -> Result:  # fmt: skip
    """(c): llama-server, each line its own request, 2 x slots in flight."""
    import subprocess
    import tempfile

    port = free_port()
    cmd = [*server_command(binary_dir, model, "short", args), "--port", str(port)]
    with tempfile.TemporaryFile() as logf:
        server = subprocess.Popen(cmd, stdout=logf, stderr=logf)
        try:
            wait_up(f"http://127.0.0.1:{port}/health", server, "llama-server")
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            start, cpu = time.perf_counter(), cpu_seconds(server.pid)
            with ThreadPoolExecutor(2 * args.parallel) as pool:
                outs = list(pool.map(lambda b: post_json(url, b), bodies))
            elapsed, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu
            usages = [tokens_of(o) for o in outs]
            return Result(elapsed, sum(p for p, _ in usages), sum(c for _, c in usages), cpu)
        finally:
            server.terminate()
            server.wait(timeout=30)


def replay(model: Path, workload: str, texts: list[str]) -> tuple[int, int, float]:
    """(forced, all) answer tokens and the grammar's CPU seconds over them: each answer
    tokenized canonically and replayed through its grammar as the engine runs it. At each
    point the tokens compute_ff_tokens gives count as forced (fed as a chunk); every other
    token costs a mask (llguidance, one thread), its application to a row of logits (numpy)
    and the consume."""
    import llama_cpp as lc
    import numpy as np
    from llguidance import LLMatcher
    from llguidance.llamacpp import lltokenizer_from_vocab

    from app.engine import structured

    if workload == "tools":
        grammar = structured.call_grammar(call_schema(), strict=True, or_text=False)
    else:
        grammar = structured.json_schema_grammar(
            {"schema": SHEET if workload == "sheet" else EXTRACT, "strict": True}
        )
    params = lc.llama_model_default_params()
    params.vocab_only = True
    handle = lc.llama_model_load_from_file(str(model).encode(), params)
    vocab = lc.llama_model_get_vocab(handle)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tok = lltokenizer_from_vocab(vocab)
    words = (n_vocab + 31) // 32
    mask = np.zeros(words, dtype=np.int32)
    logits = np.zeros(n_vocab, dtype=np.float32)
    forced = total = 0
    cpu = 0.0
    for text in texts:
        ids = tok.tokenize_str(text)
        matcher = LLMatcher(tok, grammar, log_level=0)
        i = 0
        while i < len(ids):
            start = time.process_time()
            matcher.unsafe_compute_mask_ptr(mask.ctypes.data, words * 4)
            bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:n_vocab]
            np.putmask(logits, bits == 0, -np.inf)
            ok = matcher.consume_token(ids[i])
            i += 1
            ahead = matcher.compute_ff_tokens() if ok else []
            if ahead and ids[i : i + len(ahead)] == ahead:
                matcher.consume_tokens(ahead)
                forced += len(ahead)
                i += len(ahead)
            cpu += time.process_time() - start
            if not ok:
                break
        total += len(ids)
    lc.llama_model_free(handle)
    return forced, total, cpu


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument("--lines", type=int, default=256)
    p.add_argument("--parallel", type=int, default=32)
    p.add_argument("--ctx-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-type", default="f16")
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--server-bin", default="", help="llama-server's dir (default: built)")
    p.add_argument("--no-server", action="store_true", help="skip llama-server")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from app.config import bundled_model_path

    model = args.model or bundled_model_path()
    binary_dir = None if args.no_server else binaries(args)
    rows = []
    for workload in WORKLOADS if args.workload == "all" else (args.workload,):
        lines = bodies_for(workload, args.lines)
        plain, _ = run_batchyard_lines(model, lines["plain"], args)
        schema, texts = run_batchyard_lines(model, lines["schema"], args)
        server = None
        if binary_dir is not None:
            server = run_server_lines(binary_dir, model, lines["server"], args)
        forced, total, grammar_cpu = replay(model, workload, texts)
        rows.append((workload, plain, schema, server, forced, total, grammar_cpu))
        print(json.dumps({"workload": workload, "plain": vars(plain), "schema": vars(schema),
                          "server": vars(server) if server else None, "forced": forced,
                          "answer_tokens": total, "grammar_cpu_s": grammar_cpu}), flush=True)  # fmt: skip
    print()
    print("| workload | side | wall s | completion tok/s | CPU ms/token |")
    print("|---|---|---:|---:|---:|")
    for workload, plain, schema, server, *_ in rows:
        for side, r in (("batchyard, no schema", plain), ("batchyard, schema", schema),
                        ("llama-server, json_schema", server)):  # fmt: skip
            if r is None:
                continue
            tps = r.completion_tokens / r.seconds
            cpu = 1000 * r.cpu_seconds / max(r.completion_tokens, 1)
            print(f"| {workload} | {side} | {r.seconds:.1f} | {tps:.0f} | {cpu:.2f} |")
    print()
    print("| workload | forced tokens | grammar CPU ms/token | wall/token schema / none "
          "| llama-server wall / batchyard's |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for workload, plain, schema, server, forced, total, grammar_cpu in rows:
        per_token = (schema.seconds / max(schema.completion_tokens, 1)) / (
            plain.seconds / max(plain.completion_tokens, 1)
        )
        vs = f"{server.seconds / schema.seconds:.2f}x" if server else "-"
        print(f"| {workload} | {100 * forced / max(total, 1):.0f}% | {1000 * grammar_cpu / max(total, 1):.3f} "
              f"| {per_token:.2f}x | {vs} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
