"""The thinking models' command line (harness/reasoning_model.py writes them):

    python bench/reasoning_model.py DIR [--format think|opened|channels]

writes DIR/think.gguf, DIR/opened.gguf and DIR/channels.gguf (or the one format).

    python bench/reasoning_model.py DIR --llama-server "$(bash bench/build_llama_server.sh)"

then starts that llama-server on each file (`--reasoning-format deepseek`, greedy requests)
and prints what it answers to each of the format's RECIPES: the request, `message.content`,
`message.reasoning_content`, the finish reason and the usage. These are the judge's answers
that batchyard's engine is checked against. llama-server runs with batchyard's default KV
cache (`-fa on -ctk q8_0 -ctv q8_0`), with which the two agree token for token; `--kv f16`
runs it with its own default (an f16 cache), where SmolLM2's near ties (0.1 logits) may
go the other way a few dozen tokens in.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.reasoning_model import FORMATS, write  # noqa: E402

QUESTION = "What is the capital of France?"
#: Flags every llama-server run gets: one slot, the thought apart from the answer.
SERVER_FLAGS = ["-c", "2048", "-np", "1", "-t", "2", "--reasoning-format", "deepseek"]
KV_FLAGS = {"f16": [], "q8_0": ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]}


def body(**fields: Any) -> dict[str, Any]:
    """A greedy chat request with QUESTION, and `fields`."""
    return {
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 64,
        **fields,
    }


#: Each format's requests: the model thinks on its own and stops where SmolLM2 would; a
#: budget of 4 thought tokens (llama-server's `thinking_budget_tokens`, which its
#: `--reasoning-budget` sets for every request) closes the thought early; the format's own
#: switches.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "think": {
        "thinks": body(),
        "budget 4": body(thinking_budget_tokens=4),
        "thinking off": body(chat_template_kwargs={"enable_thinking": False}),
        "inline": body(reasoning_format="none"),
    },
    "opened": {
        "thinks": body(),
        "budget 4": body(thinking_budget_tokens=4),
        "inline": body(reasoning_format="none"),
    },
    "channels": {
        "thinks": body(),
        "budget 4": body(thinking_budget_tokens=4),
        "effort low": body(reasoning_effort="low"),
        "inline": body(reasoning_format="none"),
    },
}


def ask_llama_server(
    bin_dir: Path, path: Path, recipes: dict[str, dict[str, Any]], kv: str, port: int
) -> dict[str, dict[str, Any]]:
    """Start llama-server on the model at `path`, send each recipe, return the answers."""
    import httpx

    from bench.throughput import llama_server

    command = [
        str(bin_dir / "llama-server"), "-m", str(path), "--port", str(port), *SERVER_FLAGS,
        *KV_FLAGS[kv],
    ]  # fmt: skip
    answers = {}
    with llama_server(command, port):
        for name, request in recipes.items():
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json=request, timeout=300
            )
            answers[name] = reply.json()
    return answers


def main(argv: list[str]) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dir", type=Path, help="where FORMAT.gguf go")
    parser.add_argument("--format", choices=FORMATS, help="only this format")
    parser.add_argument("--source", type=Path, help="the SmolLM2 GGUF (default: embedded)")
    parser.add_argument(
        "--llama-server", type=Path, metavar="BIN_DIR", help="then ask that llama-server"
    )
    parser.add_argument("--kv", choices=sorted(KV_FLAGS), default="q8_0", help="its KV cache")
    parser.add_argument("--port", type=int, default=8392, help="llama-server's port")
    args: Any = parser.parse_args(argv)
    formats = [args.format] if args.format else list(FORMATS)
    for fmt in formats:
        start = time.perf_counter()
        path = write(args.dir / f"{fmt}.gguf", fmt, args.source)
        size = path.stat().st_size / 1e6
        print(f"{path} ({size:.1f} MB, written in {time.perf_counter() - start:.1f} s)")
    if not args.llama_server:
        return 0
    for fmt in formats:
        answers = ask_llama_server(
            args.llama_server, args.dir / f"{fmt}.gguf", RECIPES[fmt], args.kv, args.port
        )
        for name, answer in answers.items():
            print(f"\n{fmt} / {name}: {json.dumps(RECIPES[fmt][name])}")
            if "choices" not in answer:
                print("  error:", json.dumps(answer))
                continue
            choice = answer["choices"][0]
            message = choice["message"]
            print("  content:", json.dumps(message.get("content")))
            print("  reasoning_content:", json.dumps(message.get("reasoning_content")))
            print("  finish_reason:", choice["finish_reason"])
            print("  usage:", json.dumps(answer["usage"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
