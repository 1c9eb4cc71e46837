"""`batchyard serve --files-url s3://...` on a real SeaweedFS: the openai SDK's whole path."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from minio import Minio
from openai import OpenAI

from tests.factories import batch_line, jsonl
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, LiveServer, batchyard, start_server, stop_server
from tests.seaweed import ACCESS_KEY, SECRET_KEY, Seaweed

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
    client = Minio(
        seaweed.endpoint.removeprefix("http://"),
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        secure=False,
        region="us-east-1",
    )
    listed = client.list_objects(seaweed.bucket, prefix=f"{PREFIX}/{folder}/", recursive=True)
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
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).read().splitlines()]
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
