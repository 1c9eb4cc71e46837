"""The official openai SDK against a live `batchyard serve` on the real default model."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest
from openai import OpenAI
from openai.types import Batch

from tests.factories import CHAT, batch_line, jsonl, jsonl_lines, jsonl_texts
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer


class OpenAIBatchProcessor:
    """The batch script users run against OpenAI, unchanged but for the base URL."""

    def __init__(self, api_key: str, base_url: str) -> None:
        self.client = OpenAI(api_key=api_key, base_url=base_url)

    def process_batch(
        self, input_file_path: str, endpoint: str, completion_window: str
    ) -> list[dict]:
        with open(input_file_path, "rb") as file:
            uploaded_file = self.client.files.create(file=file, purpose="batch")
        batch_job = self.client.batches.create(
            input_file_id=uploaded_file.id, endpoint=endpoint, completion_window=completion_window
        )
        while batch_job.status not in ["completed", "failed", "cancelled"]:
            time.sleep(1)
            print(f"Batch job status: {batch_job.status}...trying again in a second...")
            batch_job = self.client.batches.retrieve(batch_job.id)
        if batch_job.status == "completed":
            print(f"Batch job completed: {batch_job.request_counts}")
            self.request_counts = batch_job.request_counts
            result_file_id = batch_job.output_file_id
            result = self.client.files.content(result_file_id).read()
            return [json.loads(line) for line in result.decode("utf-8").strip().split("\n")]
        raise RuntimeError(f"Batch job failed: {batch_job}")


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> OpenAI:
    return OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)


def to_file(lines: list[dict]) -> io.BytesIO:
    buf = io.BytesIO(jsonl(*lines))
    buf.name = "input.jsonl"
    return buf


def run(
    client: OpenAI, file_id: str, endpoint: str = CHAT, *, seen: list[str] | None = None
) -> Batch:
    """A batch for the file, created and waited on until it ends."""
    b = client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )
    return wait_for_status(client.batches.retrieve, b.id, FINISHED, 300, seen=seen)


def start_long_batch(client: OpenAI, prefix: str, n: int, *, max_tokens: int) -> Batch:
    """A batch of n long stories, created and waited on until it is in progress."""
    lines = [
        batch_line(
            f"{prefix}{i}",
            f"Write a long story about the number {i}.",
            max_tokens=max_tokens,
            temperature=0,
        )
        for i in range(n)
    ]
    f = client.files.create(file=to_file(lines), purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return wait_for_status(client.batches.retrieve, b.id, ("in_progress",), 300)


def test_mission_example_runs_unchanged(live_server: LiveServer, tmp_path) -> None:
    path = tmp_path / "batch_input.jsonl"
    tasks = [
        {
            "custom_id": "task-0",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-3.5-turbo-0125",
                "messages": [{"role": "user", "content": "Tell me the names of three NBA players"}],
                "max_tokens": 32,
            },
        },
        {
            "custom_id": "task-1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-3.5-turbo-0125",
                "messages": [{"role": "user", "content": "Name three capital cities"}],
                "max_tokens": 32,
            },
        },
    ]
    path.write_text("\n".join(json.dumps(t) for t in tasks) + "\n")
    started = time.time()
    proc = OpenAIBatchProcessor(api_key="sk-local", base_url=live_server.api)
    results = proc.process_batch(str(path), "/v1/chat/completions", "24h")
    print(f"2-line batch: {time.time() - started:.1f}s from upload to results")
    counts = proc.request_counts
    assert (counts.completed, counts.failed, counts.total) == (2, 0, 2)
    assert sorted(r["custom_id"] for r in results) == ["task-0", "task-1"]
    for r in results:
        assert r["error"] is None and r["response"]["status_code"] == 200
        body = r["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["model"] != "gpt-3.5-turbo-0125" and "SmolLM2" in body["model"]
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
        assert choice["finish_reason"] in ("stop", "length")
        u = body["usage"]
        assert u["prompt_tokens"] > 5 and 0 < u["completion_tokens"] <= 32
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_all_three_endpoints_and_usage(client: OpenAI) -> None:
    cases = {
        "/v1/chat/completions": [
            batch_line("c1", "Say hi.", max_tokens=8, temperature=0),
            batch_line("c2", "Say bye.", max_tokens=8, temperature=0),
        ],
        "/v1/completions": [
            {
                "custom_id": "p1",
                "method": "POST",
                "url": "/v1/completions",
                "body": {
                    "model": "x",
                    "prompt": "The capital of France is",
                    "max_tokens": 8,
                    "temperature": 0,
                },
            }
        ],
        "/v1/embeddings": [
            {
                "custom_id": "e1",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "x", "input": ["hello world", "good night"]},
            },
            {
                "custom_id": "e2",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "x", "input": "single string"},
            },
        ],
    }
    for endpoint, lines in cases.items():
        f = client.files.create(file=to_file(lines), purpose="batch")
        seen: list[str] = []
        b = run(client, f.id, endpoint, seen=seen)
        assert b.status == "completed", (endpoint, b)
        assert seen[-1] == "completed"
        assert b.request_counts.completed == len(lines) and b.request_counts.failed == 0
        out = jsonl_lines(client.files.content(b.output_file_id).text)
        assert sorted(o["custom_id"] for o in out) == sorted(x["custom_id"] for x in lines)
        bodies = {o["custom_id"]: o["response"]["body"] for o in out}
        total_in = sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in out)
        assert b.usage is not None and b.usage.input_tokens == total_in
        if endpoint == "/v1/completions":
            assert (
                bodies["p1"]["object"] == "text_completion" and bodies["p1"]["choices"][0]["text"]
            )
        if endpoint == "/v1/embeddings":
            assert [d["index"] for d in bodies["e1"]["data"]] == [0, 1]
            vec = bodies["e2"]["data"][0]["embedding"]
            assert len(vec) > 100 and abs(sum(v * v for v in vec) - 1.0) < 1e-3
            assert b.usage.output_tokens == 0


def test_error_line_does_not_stop_the_batch(client: OpenAI) -> None:
    long_prompt = "word " * 3000  # far beyond the 1024-token slot context
    lines = [
        batch_line("ok-1", "Say yes.", max_tokens=4, temperature=0),
        batch_line("too-long", long_prompt, max_tokens=4, temperature=0),
        batch_line("ok-2", "Say no.", max_tokens=4, temperature=0),
    ]
    f = client.files.create(file=to_file(lines), purpose="batch")
    b = run(client, f.id)
    assert b.status == "completed"
    assert (b.request_counts.completed, b.request_counts.failed, b.request_counts.total) == (
        2,
        1,
        3,
    )
    out = jsonl_lines(client.files.content(b.output_file_id).text)
    err = jsonl_lines(client.files.content(b.error_file_id).text)
    assert [o["custom_id"] for o in out] == ["ok-1", "ok-2"]
    assert [e["custom_id"] for e in err] == ["too-long"]
    assert err[0]["response"]["status_code"] == 400
    assert err[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"


def test_validation_failure_names_lines(client: OpenAI) -> None:
    raw = io.BytesIO(
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\nnot json\n'
    )
    raw.name = "bad.jsonl"
    f = client.files.create(file=raw, purpose="batch")
    b = run(client, f.id)
    assert b.status == "failed" and b.failed_at
    assert b.errors is not None and [(e.line, e.code) for e in b.errors.data] == [
        (2, "invalid_json_line")
    ]


def test_cancel_running_batch(client: OpenAI) -> None:
    b = start_long_batch(client, "c", 40, max_tokens=200)
    time.sleep(2)
    c = client.batches.cancel(b.id)
    assert c.status in ("cancelling", "cancelled") and c.cancelling_at
    b = wait_for_status(client.batches.retrieve, b.id, ("cancelled",), 60)
    assert b.cancelled_at and b.request_counts.total == 40
    done = b.request_counts.completed + b.request_counts.failed
    assert done < 40
    lines_out = jsonl_texts(client.files.content(b.output_file_id).text) if b.output_file_id else []
    lines_err = jsonl_texts(client.files.content(b.error_file_id).text) if b.error_file_id else []
    assert (
        len(lines_out) == b.request_counts.completed and len(lines_err) == b.request_counts.failed
    )
    small = client.files.create(
        file=to_file([batch_line("z", "hi", max_tokens=2, temperature=0)]), purpose="batch"
    )
    finished = run(client, small.id)
    assert finished.status == "completed"
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.cancel(finished.id)
    assert exc.value.status_code == 400 and "completed" in str(exc.value)


def test_files_and_batches_pagination(client: OpenAI) -> None:
    ids = [
        client.files.create(
            file=to_file([batch_line(f"p{i}", "hi", max_tokens=2, temperature=0)]), purpose="batch"
        ).id
        for i in range(3)
    ]
    page = client.files.list(limit=2, purpose="batch")
    assert [f.id for f in page.data] == ids[::-1][:2] and page.has_more
    everything = [f.id for f in client.files.list(purpose="batch", limit=2)]
    assert everything[:3] == ids[::-1]
    batches = [
        client.batches.create(
            input_file_id=i, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for i in ids
    ]
    listed = [b.id for b in client.batches.list(limit=2)]
    assert listed[:3] == batches[::-1]
    for bid in batches:
        wait_for_status(client.batches.retrieve, bid, FINISHED, 300)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_doesnotexist")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-doesnotexist")
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(
            input_file_id="file-doesnotexist",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    assert exc.value.code == "file_not_found"


def test_online_endpoints(client: OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] and "SmolLM2" in models.data[0].id
    r = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=0,
    )
    assert r.choices[0].message.content and r.usage and r.usage.completion_tokens <= 8
    again = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=0,
    )
    assert again.choices[0].message.content == r.choices[0].message.content
    seeded = [
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Tell me a word."}],
            max_tokens=8,
            temperature=1.0,
            seed=7,
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert text == r.choices[0].message.content


def test_streamed_usage_comes_once(client: OpenAI) -> None:
    """`stream_options.include_usage`: one usage chunk (no choices) before [DONE], with the
    same counts as the same greedy request unstreamed."""
    ask = {
        "model": "m",
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**ask)
    chunks = list(
        client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1, [c.model_dump() for c in with_usage]
    (tail,) = with_usage
    assert tail.choices == [] and chunks[-1] is tail
    assert whole.usage is not None and tail.usage is not None
    assert (tail.usage.prompt_tokens, tail.usage.completion_tokens, tail.usage.total_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
        whole.usage.total_tokens,
    )
    text = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_online_request_goes_ahead_of_a_running_batch(client: OpenAI) -> None:
    b = start_long_batch(client, "bg", 60, max_tokens=128)
    started = time.time()
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=0,
    )
    took = time.time() - started
    during = client.batches.retrieve(b.id)
    client.batches.cancel(b.id)
    assert r.choices[0].message.content and r.usage and r.usage.completion_tokens <= 8
    # It finished while most of the batch was still waiting: it did not queue behind it.
    assert during.status == "in_progress", during.status
    assert during.request_counts is not None and during.request_counts.completed < 60
    print(f"online request during a 60-line batch: {took:.2f}s")
    wait_for_status(client.batches.retrieve, b.id, ("cancelled",), 60)
