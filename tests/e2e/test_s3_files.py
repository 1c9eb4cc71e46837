"""`batchyard serve --files-url s3://...` on a real SeaweedFS: the openai SDK's whole path,
and a 256 MiB file in 8 Uploads API parts with the server's RSS sampled meanwhile."""

from __future__ import annotations

import hashlib
import io
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from harness.seaweed import Seaweed
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, LiveServer, batchyard, start_server, stop_server

PREFIX = "e2e"


@pytest.fixture(scope="module")
def s3_server(seaweed: Seaweed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(
        tmp_path_factory.mktemp("s3-node"),
        OUTPUT / "s3-server.log",
        env=seaweed.env(),
        args=[
            "--files-url",
            f"s3://{seaweed.bucket}/{PREFIX}",
            "--s3-endpoint",
            seaweed.endpoint,
        ],
    )
    yield server
    stop_server(server)


def objects(seaweed: Seaweed, folder: str = "files") -> set[str]:
    listed = seaweed.client().list_objects(
        seaweed.bucket, prefix=f"{PREFIX}/{folder}/", recursive=True
    )
    return {(o.object_name or "").rsplit("/", 1)[-1] for o in listed if not o.is_dir}


def test_a_batch_runs_with_its_files_in_the_bucket(s3_server: LiveServer, seaweed: Seaweed) -> None:
    client = OpenAI(api_key="unused", base_url=s3_server.api, max_retries=0)
    lines = [batch_line(f"s3-{i}", f"Say {i}.", max_tokens=4, temperature=0) for i in range(3)]
    data = jsonl(*lines)
    upload = io.BytesIO(data)
    upload.name = "input.jsonl"
    f = client.files.create(file=upload, purpose="batch")
    assert f.id in objects(seaweed)
    assert not any((s3_server.data_dir / "files").iterdir())  # no byte on the node's disk
    assert client.files.content(f.id).read() == data

    created = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_for_status(client.batches.retrieve, created.id, FINISHED, 300)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    assert batch.output_file_id is not None and batch.error_file_id is None
    assert batch.output_file_id in objects(seaweed)
    out = jsonl_lines(client.files.content(batch.output_file_id).read())
    assert sorted(o["custom_id"] for o in out) == ["s3-0", "s3-1", "s3-2"]
    assert all(o["response"]["status_code"] == 200 for o in out)

    client.files.delete(batch.output_file_id)
    assert batch.output_file_id not in objects(seaweed)


def test_serve_stops_at_once_on_a_bucket_it_cannot_use(seaweed: Seaweed, tmp_path: Path) -> None:
    done = batchyard(
        "serve",
        "--no-browser",
        "--data-dir",
        str(tmp_path),
        "--files-url",
        "s3://no-such-bucket/x",
        "--s3-endpoint",
        seaweed.endpoint,
        env=seaweed.env(),
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"batchyard: The bucket 'no-such-bucket' does not exist at {seaweed.endpoint}: "
        "create it first."
    )


def test_an_upload_in_parts_is_kept_in_the_bucket(s3_server: LiveServer, seaweed: Seaweed) -> None:
    client = OpenAI(api_key="unused", base_url=s3_server.api, max_retries=0)
    pieces = [b"first part\n" * 1000, b"second part\n" * 10]
    whole = b"".join(pieces)
    up = client.uploads.create(
        bytes=len(whole), filename="parts.txt", mime_type="text/plain", purpose="user_data"
    )
    part_ids = [client.uploads.parts.create(upload_id=up.id, data=p).id for p in pieces]
    assert {k.rsplit("/", 1)[-1] for k in objects(seaweed, "uploads")} >= set(part_ids)
    done = client.uploads.complete(
        upload_id=up.id, part_ids=part_ids, md5=hashlib.md5(whole).hexdigest()
    )
    assert done.status == "completed" and done.file is not None
    assert client.files.content(done.file.id).read() == whole
    assert not any(k.endswith(tuple(part_ids)) for k in objects(seaweed, "uploads"))


# -- a large upload in parts: the server RSS stays flat -----------------------------------

MIB = 1024 * 1024
PARTS = 8
PART_BYTES = 32 * MIB  # 8 x 32 MiB = 256 MiB (268 MB)
#: What the server may grow by while it takes the parts and completes the upload.
RSS_GROWTH_LIMIT_MB = 64
#: The pattern the parts' bytes are cut from (random, so a shifted part would not match).
PATTERN = random.Random(24).randbytes(MIB + 7)


class PartBytes(io.RawIOBase):
    """`size` bytes of part `index`, made as they are read: PATTERN from an offset that
    depends on the part, so every part differs and the whole file is never in memory."""

    def __init__(self, index: int, size: int) -> None:
        self.index = index
        self.size = size
        self.name = f"part-{index}.bin"
        self._pos = 0
        self._shift = index * 104_729

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, min(self.size, base + offset))
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and self._pos < self.size:
            start = (self._pos + self._shift) % len(PATTERN)
            n = min(len(view) - filled, self.size - self._pos, len(PATTERN) - start)
            view[filled : filled + n] = PATTERN[start : start + n]
            filled += n
            self._pos += n
        return filled


def md5_of_parts() -> str:
    digest = hashlib.md5(usedforsecurity=False)
    for i in range(PARTS):
        stream = PartBytes(i, PART_BYTES)
        while piece := stream.read(4 * MIB):
            digest.update(piece)
    return digest.hexdigest()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class PeakRss:
    """The highest RSS of a process, sampled every 20 ms while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb(self.pid))


def test_a_256_mib_upload_in_8_parts_keeps_the_server_rss_flat(
    s3_server: LiveServer, seaweed: Seaweed
) -> None:
    client = OpenAI(api_key="unused", base_url=s3_server.api, max_retries=0, timeout=300)
    total = PARTS * PART_BYTES
    md5 = md5_of_parts()
    pid = s3_server.process.pid
    before = rss_mb(pid)
    with PeakRss(pid) as rss:
        up = client.uploads.create(
            bytes=total,
            filename="big.bin",
            mime_type="application/octet-stream",
            purpose="user_data",
        )
        part_ids = [
            client.uploads.parts.create(upload_id=up.id, data=PartBytes(i, PART_BYTES)).id
            for i in range(PARTS)
        ]
        assert objects(seaweed, "uploads") >= set(part_ids)
        done = client.uploads.complete(upload_id=up.id, part_ids=part_ids, md5=md5)
    growth = rss.peak - before
    print(f"server RSS {before:.1f} MB before, {rss.peak:.1f} MB at peak: +{growth:.1f} MB")
    assert done.status == "completed" and done.file is not None
    assert done.file.bytes == total
    assert growth < RSS_GROWTH_LIMIT_MB, f"the server grew by {growth:.1f} MB"
    assert done.file.id in objects(seaweed)
    assert not set(part_ids) & objects(seaweed, "uploads")

    # The stored file is the parts in order: its md5, read back as a stream.
    digest = hashlib.md5(usedforsecurity=False)
    with client.files.with_streaming_response.content(done.file.id) as response:
        for piece in response.iter_bytes(4 * MIB):
            digest.update(piece)
    assert digest.hexdigest() == md5

    client.files.delete(done.file.id)
    assert done.file.id not in objects(seaweed)
