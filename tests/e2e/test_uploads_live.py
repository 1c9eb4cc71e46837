"""The Uploads API on a live server: 8 parts sent at once by the SDK, completed into the
input of a batch that the real model runs."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer


def test_eight_parts_in_parallel_make_a_batch_input(live_server: LiveServer) -> None:
    client = OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)
    data = jsonl(*(batch_line(f"p{i}", f"Say {i}.", max_tokens=4) for i in range(4)))
    step = -(-len(data) // 8)
    pieces = [data[i : i + step] for i in range(0, len(data), step)]
    assert len(pieces) == 8
    up = client.uploads.create(
        bytes=len(data), filename="parts.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    with ThreadPoolExecutor(8) as pool:
        parts = list(
            pool.map(lambda piece: client.uploads.parts.create(upload_id=up.id, data=piece), pieces)
        )
    done = client.uploads.complete(
        upload_id=up.id, part_ids=[p.id for p in parts], md5=hashlib.md5(data).hexdigest()
    )
    assert done.status == "completed" and done.file is not None
    assert client.files.content(done.file.id).content == data
    b = client.batches.create(
        input_file_id=done.file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    finished = wait_for_status(client.batches.retrieve, b.id, FINISHED, 300)
    assert finished.status == "completed" and finished.output_file_id
    out = jsonl_lines(client.files.content(finished.output_file_id).text)
    assert sorted(o["custom_id"] for o in out) == [f"p{i}" for i in range(4)]
