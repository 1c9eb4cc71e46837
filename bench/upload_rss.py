"""Server memory during a large upload through the Uploads API, against a live `batchyard serve`.

Starts a server (raising its part and file limits to fit), writes the parts to a temporary
folder, sends them all at once with the openai SDK (one thread per part, each read from
its own file), completes the upload with its md5, and samples the server's RSS from
/proc every 50 ms throughout. Prints the RSS before, the peak during the parts, the peak
during complete, and the throughput. Linux only (reads /proc).

    python bench/upload_rss.py                 # 8 parts of 128 MiB: 1 GiB
    python bench/upload_rss.py --parts 16 --part-mib 64 --json result.json
    python bench/upload_rss.py --s3 --part-mib 32    # the node's files on SeaweedFS
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openai import OpenAI  # noqa: E402

from harness.live import OUTPUT, start_server, stop_server  # noqa: E402
from harness.seaweed import seaweed_server  # noqa: E402

MIB = 1024 * 1024


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """RSS of one process every `interval` seconds; `peak()` since the last `mark()`."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(rss_mib(self.pid))
            time.sleep(self.interval)

    def start(self) -> None:
        self._thread.start()

    def mark(self) -> int:
        return len(self.samples)

    def peak(self, since: int) -> float:
        return max(self.samples[since:], default=rss_mib(self.pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def write_parts(folder: Path, parts: int, part_bytes: int) -> tuple[list[Path], str]:
    """The parts as files of pseudo-random bytes; returns them and the whole file's md5."""
    digest = hashlib.md5(usedforsecurity=False)
    paths = []
    block = hashlib.sha256(b"seed").digest() * (MIB // 32)
    for i in range(parts):
        path = folder / f"part-{i:02d}"
        with open(path, "wb") as fh:
            for j in range(part_bytes // MIB):
                piece = bytes([i, j % 256]) + block[2:]
                fh.write(piece)
                digest.update(piece)
        paths.append(path)
    return paths, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--part-mib", type=int, default=128)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--s3", action="store_true", help="the node's files on SeaweedFS")
    args = ap.parse_args(argv)
    part_bytes = args.part_mib * MIB
    total = args.parts * part_bytes
    env = {
        "BATCHYARD_MAX_UPLOAD_PART_BYTES": str(part_bytes),
        "BATCHYARD_MAX_FILE_BYTES": str(total),
    }
    with tempfile.TemporaryDirectory(prefix="upload-rss-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        paths, md5 = write_parts(folder, args.parts, part_bytes)
        extra: list[str] = []
        if args.s3:
            (folder / "seaweed").mkdir()
            seaweed = stack.enter_context(seaweed_server(folder / "seaweed", folder / "sw.log"))
            if isinstance(seaweed, str):
                raise SystemExit(f"--s3: {seaweed}")
            env |= seaweed.env()
            extra = ["--files-url", f"s3://{seaweed.bucket}/rss", "--s3-endpoint", seaweed.endpoint]
        server = start_server(folder / "data", OUTPUT / "upload-rss.log", env=env, args=extra)
        try:
            client = OpenAI(api_key="unused", base_url=server.api, max_retries=0, timeout=600)
            pid = server.process.pid
            time.sleep(1.0)
            before = rss_mib(pid)
            sampler = Sampler(pid)
            sampler.start()
            up = client.uploads.create(
                bytes=total,
                filename="big.bin",
                mime_type="application/octet-stream",
                purpose="user_data",
            )
            started = time.perf_counter()

            def send(path: Path) -> str:
                with open(path, "rb") as fh:
                    return client.uploads.parts.create(upload_id=up.id, data=fh).id

            with ThreadPoolExecutor(args.parts) as pool:
                part_ids = list(pool.map(send, paths))
            parts_s = time.perf_counter() - started
            parts_peak = sampler.peak(0)
            mark = sampler.mark()
            started = time.perf_counter()
            done = client.uploads.complete(upload_id=up.id, part_ids=part_ids, md5=md5)
            complete_s = time.perf_counter() - started
            complete_peak = sampler.peak(mark)
            sampler.stop()
            assert done.file is not None and done.file.bytes == total
            after = rss_mib(pid)
        finally:
            stop_server(server)
    figures: dict[str, Any] = {
        "files": "s3" if args.s3 else "directory",
        "parts": args.parts,
        "part_mib": args.part_mib,
        "total_mib": total // MIB,
        "rss_before_mib": round(before, 1),
        "rss_peak_parts_mib": round(parts_peak, 1),
        "rss_peak_complete_mib": round(complete_peak, 1),
        "rss_after_mib": round(after, 1),
        "parts_seconds": round(parts_s, 2),
        "parts_mib_per_s": round(total / MIB / parts_s, 1),
        "complete_seconds": round(complete_s, 2),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
