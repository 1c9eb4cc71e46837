"""File bytes on the directory against a bucket on SeaweedFS, side by side in one run.

Starts SeaweedFS (harness/seaweed.py) and two `batchyard serve` nodes, one per backend, then
in alternating rounds uploads one file with the openai SDK (`POST /v1/files`) and downloads
it again, sampling each server's RSS every 50 ms. Prints, per backend, the median upload
and download MB/s, the RSS growth at its peak, and the ratios S3 / directory.

    python bench/s3_files.py                 # 200 MiB, 3 rounds
    python bench/s3_files.py --mib 64 --rounds 2 --json result.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openai import OpenAI  # noqa: E402

from bench.upload_rss import MIB, Sampler, rss_mib  # noqa: E402
from harness.live import OUTPUT, LiveServer, start_server, stop_server  # noqa: E402
from harness.seaweed import seaweed_server  # noqa: E402


def write_file(path: Path, mib: int) -> None:
    block = hashlib.sha256(b"seed").digest() * (MIB // 32)
    with open(path, "wb") as fh:
        for j in range(mib):
            fh.write(bytes([j % 256]) + block[1:])


def one_round(server: LiveServer, path: Path, size: int) -> dict[str, float]:
    client = OpenAI(api_key="unused", base_url=server.api, max_retries=0, timeout=600)
    pid = server.process.pid
    before = rss_mib(pid)
    sampler = Sampler(pid)
    sampler.start()
    started = time.perf_counter()
    with open(path, "rb") as fh:
        f = client.files.create(file=fh, purpose="user_data")
    up_s = time.perf_counter() - started
    started = time.perf_counter()
    got = 0
    with client.files.with_streaming_response.content(f.id) as response:
        for chunk in response.iter_bytes(MIB):
            got += len(chunk)
    down_s = time.perf_counter() - started
    peak = sampler.peak(0)
    sampler.stop()
    assert got == size, (got, size)
    client.files.delete(f.id)
    return {
        "upload_mib_s": size / MIB / up_s,
        "download_mib_s": size / MIB / down_s,
        "rss_growth_mib": peak - before,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="s3-files-") as tmp:
        folder = Path(tmp)
        path = folder / "big.bin"
        write_file(path, args.mib)
        (folder / "weed").mkdir()
        with seaweed_server(folder / "weed", OUTPUT / "bench-seaweed.log") as weed:
            if isinstance(weed, str):
                print(weed, file=sys.stderr)
                return 1
            servers = {
                "directory": start_server(folder / "dir", OUTPUT / "bench-dir.log"),
                "s3": start_server(
                    folder / "s3",
                    OUTPUT / "bench-s3.log",
                    env=weed.env(),
                    args=[
                        "--files-url",
                        f"s3://{weed.bucket}/bench",
                        "--s3-endpoint",
                        weed.endpoint,
                    ],
                ),
            }
            results: dict[str, list[dict[str, float]]] = {k: [] for k in servers}
            try:
                for r in range(args.rounds):
                    for name, server in servers.items():
                        figures = one_round(server, path, args.mib * MIB)
                        results[name].append(figures)
                        print(f"round {r + 1} {name}: " + json.dumps(figures), flush=True)
            finally:
                for server in servers.values():
                    stop_server(server)
    summary: dict[str, Any] = {"mib": args.mib, "rounds": args.rounds}
    for name, rows in results.items():
        for key in ("upload_mib_s", "download_mib_s", "rss_growth_mib"):
            summary[f"{name}_{key}"] = round(statistics.median(x[key] for x in rows), 1)
    for key in ("upload_mib_s", "download_mib_s"):
        summary[f"ratio_{key}"] = round(summary[f"s3_{key}"] / summary[f"directory_{key}"], 2)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
