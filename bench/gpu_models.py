"""Random-weight GGUF models for bench/gpu.sh, written where the benchmark runs.

The GPU machine has no registry and takes at most 64 MiB along, so the embedded model (98 MB)
cannot go; speed depends on shapes and tensor types, not on weight values. Two steps:

    python bench/gpu_models.py tokenizer OUT.json.gz    # here: the embedded SmolLM2's tokenizer
    python bench/gpu_models.py write TOKENIZER.json.gz DIR   # there: the two models into DIR

`write` makes smollm2-135m-random.gguf (SmolLM2-135M's exact shapes and tensor types: Q4_1
layers, Q8_0 embeddings, tied output) and llama-1b-random.gguf (about 1.07 B parameters:
Llama-3.2-1B's layer shapes, 16 layers of 2048, 8 KV heads, with SmolLM2's tokenizer). Weights
are random quantized blocks at about the scale of a trained model's, so activations stay finite.
Needs the `gguf` package.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.random_models import Shapes, extract_tokenizer, write_model  # noqa: E402

MODELS = (
    Shapes("smollm2-135m-random", 30, 576, 1536, 9, 3, 100000.0),
    Shapes("llama-1b-random", 16, 2048, 8192, 32, 8, 500000.0),
)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("tokenizer", help="save the embedded model's tokenizer")
    tok.add_argument("out", type=Path)
    write = sub.add_parser("write", help="write the random-weight models")
    write.add_argument("tokenizer", type=Path)
    write.add_argument("dir", type=Path)
    write.add_argument("names", nargs="?", default=",".join(m.name for m in MODELS))
    args = parser.parse_args(argv)
    if args.command == "tokenizer":
        extract_tokenizer(args.out)
        return 0
    tokenizer = json.loads(gzip.decompress(args.tokenizer.read_bytes()))
    args.dir.mkdir(parents=True, exist_ok=True)
    for shapes in MODELS:
        if shapes.name in args.names.split(","):
            path = args.dir / f"{shapes.name}.gguf"
            n = write_model(shapes, tokenizer, path)
            print(f"{path} ({n / 1e6:.0f} M parameters, {path.stat().st_size >> 20} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
