"""A pipx-style install's throughput before and after `batchyard engine build --cpu`.

Two fresh venvs get batchyard from this checkout, both with the stock llama-cpp-python wheel
(`pip wheel llama-cpp-python==VERSION`, no fix header: what `pipx install .` compiles). In
the second one `batchyard engine build --cpu` then runs (compiling, or with `--fix-wheel` a
prebuilt wheel standing in for the compile). The same batch then runs through `batchyard run`
in each, interleaved A, B, A, B, and the medians of the tokens/s that `run` prints are compared.

    python bench/engine_build.py --stock-wheel DIR [--fix-wheel DIR] [--lines 128] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sh(*cmd: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def make_venv(where: Path, stock: Path) -> Path:
    """A venv with batchyard from this checkout and the stock llama-cpp-python wheel."""
    py = where / "bin/python"
    if not py.exists():
        sh(sys.executable, "-m", "venv", str(where))
        sh(str(py), "-m", "pip", "install", "-q", "--find-links", str(stock), str(ROOT))
    (wheel,) = stock.glob("llama_cpp_python-*.whl")
    sh(str(py), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel))
    return where / "bin/batchyard"


def batch_file(path: Path, n: int, max_tokens: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            body = {
                "model": "m",
                "messages": [
                    {"role": "user", "content": f"Write a short story about the number {i}."}
                ],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            fh.write(
                json.dumps(
                    {
                        "custom_id": f"r{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    }
                )
                + "\n"
            )


def run_once(exe: Path, src: Path, work: Path, cache: Path) -> tuple[float, str]:
    out = work / f"out-{time.monotonic_ns()}.jsonl"
    done = subprocess.run(
        [str(exe), "run", str(src), "-o", str(out), "--cache-dir", str(cache)],
        text=True,
        capture_output=True,
        check=False,
    )
    found = re.search(r"([\d.]+) tokens/s average", done.stderr)
    buffers = re.search(r"cpu extra buffer types: (\w+)", done.stderr)
    if not found:
        raise SystemExit(f"no throughput line:\n{done.stderr[-3000:]}")
    return float(found.group(1)), buffers.group(1) if buffers else "?"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--stock-wheel", type=Path, required=True, help="dir with the stock wheel")
    p.add_argument("--fix-wheel", type=Path, default=None, help="prebuilt fix wheel (dir or file)")
    p.add_argument("--lines", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", type=Path, default=None, help="keep (and reuse) the venvs here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        stock = make_venv(work / "stock", args.stock_wheel)
        fixed = make_venv(work / "fixed", args.stock_wheel)
        print(f"two venvs with the stock build in {time.monotonic() - t:.0f} s", flush=True)
        cmd = [str(fixed), "engine", "build", "--cpu", "--cache-dir", str(work / "cache-fixed")]
        if args.fix_wheel:
            cmd += ["--wheel", str(args.fix_wheel)]
        t = time.monotonic()
        built = subprocess.run(cmd, text=True, capture_output=True, check=False)
        print(built.stdout[-2000:], built.stderr[-2000:])
        print(f"engine build: exit {built.returncode} in {time.monotonic() - t:.0f} s", flush=True)
        for exe, name in ((stock, "stock"), (fixed, "fixed")):
            print(
                name,
                sh(str(exe), "engine", "status", "--cache-dir", str(work / f"cache-{name}")).stdout,
            )
        src = work / "in.jsonl"
        batch_file(src, args.lines, args.max_tokens)
        results: dict[str, list[float]] = {"stock": [], "fixed": []}
        for r in range(args.rounds):
            for exe, name in ((stock, "stock"), (fixed, "fixed")):
                tps, buffers = run_once(exe, src, work, work / f"cache-{name}")
                results[name].append(tps)
                print(
                    f"round {r + 1} {name}: {tps:.1f} tokens/s (extra buffers {buffers})",
                    flush=True,
                )
        a, b = statistics.median(results["stock"]), statistics.median(results["fixed"])
        print(f"median tokens/s: stock {a:.1f}, after engine build {b:.1f}; ratio {b / a:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
