"""Image lines: batchyard against llama.cpp's llama-server with the same vision model.

The model is the test vision pair (harness/vision_model.py: SmolLM2-135M-Instruct's weights
and a random-weight SmolVLM projector, 128x128 images of 32 image positions each, or
--projector gemma3), written once per machine into ~/.cache/batchyard/bench-models. Its
encoder is tiny (about 20 ms an image), so `--shape smolvlm` writes one of SmolVLM-256M's
real shapes instead (a 12-layer, 768-wide SigLIP on 512x512 tiles, 64 positions a tile: 374
MB of f32, seconds an image on a CPU), where encoding costs what it costs a user. Two
workloads, each N chat lines that ask one question of one PNG (noise, so no two images look
alike), 4 tokens out:

  distinct  every line its own image
  shared    every image asked about by 8 lines (N/8 images), the lines shuffled: the batch a
            user sends to ask several questions of each photo

run side by side in alternating rounds, through
  (a)  batchyard end to end: `python -m app.cli serve` (the pair in --models-dir as
       `vision`, --parallel 32), the openai SDK uploads the batch file and polls the batch;
  (b)  llama-server -m model.gguf --mmproj mmproj.gguf -np 32 (bench/build_llama_server.sh:
       the same llama.cpp sources), each line its own request, 32 in flight;
  (c)  the same llama-server fed every line at once (N requests in flight).
Each prints images/s (lines/s), wall and server CPU seconds; the ratios are (b)'s and (c)'s
wall time over (a)'s, the median over rounds (above 1: batchyard is faster).

    bash bench/build_llama_server.sh            # once; prints the binary dir
    python bench/vision.py --lines 64 --rounds 2
    python bench/vision.py --workload shared --lines 128
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from base64 import b64encode
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402 (the checkout on the path first)
    Result,
    binaries,
    free_port,
    through_batchyard,
    through_llama_server,
)

MODEL = "vision"
QUESTION = "Describe this picture in one word."
#: Lines asking about one image in the shared workload.
SHARE = 8
CTX = 256  # tokens a slot: the prompt (about 74 with the image) and 4 out, with room


def image(rng: random.Random, size: int = 128) -> bytes:
    """A PNG of noise: no two alike, nothing a cache could take for another."""
    from PIL import Image

    pixels = Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3))
    out = io.BytesIO()
    pixels.save(out, "PNG")
    return out.getvalue()


def bodies_for(workload: str, n: int, max_tokens: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    count = n if workload == "distinct" else max(1, n // SHARE)
    urls = [f"data:image/png;base64,{b64encode(image(rng)).decode()}" for _ in range(count)]
    picks = [urls[i % count] for i in range(n)]
    if workload == "shared":
        rng.shuffle(picks)
    return [
        {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": QUESTION},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        for url in picks
    ]


def pair(projector: str, shape: str) -> Path:
    """The vision pair's folder in ~/.cache/batchyard/bench-models, written once
    (harness/vision_model.py): the test pair's small shapes, or SmolVLM-256M's."""
    from harness.vision_model import Projector, written_pair

    kind = Projector(kind=projector)
    if shape != "small":
        kind = Projector(
            kind=projector, image_size=512, patch_size=16, n_embd=768, n_ff=3072, n_head=12,
            n_layer=12, scale_factor=4,
        )  # fmt: skip
    return written_pair(Path.home() / ".cache" / "batchyard" / "bench-models" / "vision", kind)


def run_batchyard(
    folder: Path, bodies: list[dict[str, Any]], args: argparse.Namespace, root: Path = ROOT
) -> Result:
    """(a): `batchyard serve` with the pair in its --models-dir, end to end through the SDK;
    `root`: the checkout it runs from (--old: another commit's)."""
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models" / MODEL
        models.mkdir(parents=True)
        for name in ("model.gguf", "mmproj.gguf"):
            (models / name).symlink_to(folder / name)
        serve_args = ["--data-dir", str(Path(tmp) / "data"), "--models-dir", str(models.parent),
                      "--no-discover", "--default-model", MODEL, "--parallel", str(args.parallel),
                      "--ctx-size", str(CTX), "--threads", str(args.threads),
                      "--engine-priority", "normal", *args.batchyard_arg]  # fmt: skip
        log = Path(tmp) / "serve.log"
        try:
            return through_batchyard(root, serve_args, log, "/v1/chat/completions", bodies)
        finally:
            if args.log_dir:  # kept for a look at where the time went
                Path(args.log_dir).mkdir(parents=True, exist_ok=True)
                name = f"batchyard-{root.name}-{time.strftime('%H%M%S')}.log"
                shutil.copyfile(log, Path(args.log_dir) / name)


def run_llama_server(
    binary_dir: Path,
    folder: Path,
    bodies: list[dict[str, Any]],
    in_flight: int,
    args: argparse.Namespace,
) -> Result:
    """(b)/(c): llama-server with the pair and the same slots, `in_flight` requests at once."""
    port = free_port()
    cmd = [str(binary_dir / "llama-server"), "-m", str(folder / "model.gguf"), "--mmproj",
           str(folder / "mmproj.gguf"), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(args.parallel), "-c", str(args.parallel * CTX), "-t", str(args.threads),
           "-tb", str(args.threads), "--no-webui", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]  # fmt: skip
    return through_llama_server(cmd, port, "/v1/chat/completions", bodies, in_flight)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=("distinct", "shared", "both"), default="both")
    parser.add_argument("--lines", type=int, default=64, help="lines a workload (64)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--parallel", type=int, default=32, help="slots on both sides (32)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads, 0 = all cores")
    parser.add_argument("--projector", choices=("idefics3", "gemma3"), default="idefics3")
    parser.add_argument("--shape", choices=("small", "smolvlm"), default="small",
                        help="the projector's size: the tests' (small) or SmolVLM-256M's")  # fmt: skip
    parser.add_argument("--server-bin", default="", help="llama-server's dir (default: build)")
    parser.add_argument("--no-server", action="store_true", help="batchyard alone")
    parser.add_argument("--log-dir", default="", help="keep batchyard's logs here")
    parser.add_argument("--batchyard-arg", action="append", default=[],
                        help="one more argument for batchyard serve (repeatable)")  # fmt: skip
    parser.add_argument(
        "--old",
        default="",
        help="also batchyard from this checkout (e.g. the commit before a change)",
    )
    args = parser.parse_args(argv)
    args.threads = args.threads or os.cpu_count() or 1
    return args


def show(name: str, r: Result, n: int) -> None:
    print(
        f"  {name:<22} {n / r.seconds:7.2f} images/s  wall {r.seconds:7.2f} s  "
        f"cpu {r.cpu_seconds:7.2f} s  prompt {r.prompt_tokens} (cached {r.cached_tokens})  "
        f"out {r.completion_tokens}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = pair(args.projector, args.shape)
    binary_dir = None if args.no_server else binaries(args)
    workloads = ("distinct", "shared") if args.workload == "both" else (args.workload,)
    for workload in workloads:
        bodies = bodies_for(workload, args.lines, args.max_tokens)
        images = len({b["messages"][0]["content"][1]["image_url"]["url"] for b in bodies})
        print(f"{workload}: {args.lines} lines, {images} images, {args.parallel} slots", flush=True)
        ratios: dict[str, list[float]] = {"np": [], "all": []}
        for rnd in range(args.rounds):
            print(f" round {rnd + 1}", flush=True)
            ours = run_batchyard(folder, bodies, args)
            show("batchyard", ours, args.lines)
            if args.old:
                old = run_batchyard(folder, bodies, args, Path(args.old).resolve())
                show(f"batchyard {Path(args.old).name}", old, args.lines)
                ratios.setdefault("old", []).append(old.seconds / ours.seconds)
            if binary_dir is None:
                continue
            theirs = run_llama_server(binary_dir, folder, bodies, args.parallel, args)
            show(f"llama-server {args.parallel} in flight", theirs, args.lines)
            every = run_llama_server(binary_dir, folder, bodies, len(bodies), args)
            show("llama-server all at once", every, args.lines)
            ratios["np"].append(theirs.seconds / ours.seconds)
            ratios["all"].append(every.seconds / ours.seconds)
        if binary_dir is not None:
            print(
                f" {workload}: batchyard {statistics.median(ratios['np']):.2f}x llama-server "
                f"-np {args.parallel} ({args.parallel} in flight), "
                f"{statistics.median(ratios['all']):.2f}x fed all at once "
                f"(median of {args.rounds} round(s))",
                flush=True,
            )
        if args.old:
            print(
                f" {workload}: {statistics.median(ratios['old']):.2f}x the --old checkout",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
