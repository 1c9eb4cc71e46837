"""Thinking models behind upstreams, through the openai SDK: a front whose engines are a
`vllm` and a `llama-server` upstream, both the fixed-latency upstream of harness/upstream.py
answering as a thinking model behind that server (its thought as vLLM writes it, as
llama-server does, or left inline as `<think>...</think>`; its answer echoes what it was
sent). Each thought comes back as `reasoning_content`, online, streamed and in a batch's
output lines, and as `reasoning` from a front started with `--reasoning-field reasoning`;
each kind is sent the request's reasoning controls its server's way.

The fronts are apps made in this process (app.server.create_app, served on a port; each
upstream's client is its own process as in `batchyard serve`), so that two fronts cost about
a second each, not a `batchyard serve` start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.config import Settings
from app.server import create_app
from harness.upstream import THOUGHT, THOUGHT_TOKENS, start_upstream
from tests.factories import batch_line, jsonl_lines
from tests.http_helpers import FINISHED, sdk_batch, wait_for_status
from tests.live import InProcessServer, serve_in_thread, stop_process
from tests.waiting import until

#: The thinker each engine's models name (harness/upstream.py: THINKERS), by its kind.
VLLM, INLINE, LLAMA = "vllm-thinker", "inline-thinker", "llama-thinker"
ASKED: dict[str, Any] = {
    "reasoning_effort": "low",
    "extra_body": {"thinking_token_budget": 64, "chat_template_kwargs": {"thinking": True}},
}
#: What each thinker's upstream was sent for ASKED (besides the model and max_tokens).
KWARGS = {"chat_template_kwargs": {"thinking": True}}
PASSED = {
    VLLM: {"reasoning_effort": "low", "thinking_token_budget": 64, **KWARGS},
    INLINE: {"reasoning_effort": "low", "thinking_token_budget": 64, **KWARGS},
    LLAMA: {"reasoning_effort": "low", "reasoning_budget_tokens": 64, **KWARGS},
}
#: The thought's tokens each counts: vLLM's count kept; the others give none (null).
COUNTED = {VLLM: THOUGHT_TOKENS, INLINE: None, LLAMA: None}


@dataclass
class Front:
    server: InProcessServer
    client: OpenAI


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    proc, url = start_upstream(1)
    yield url
    stop_process(proc)


def start_front(data: Path, upstream: str, **settings: Any) -> Front:
    engines = [
        f"vllm=vllm:{upstream}/v1,models={VLLM}|{INLINE},concurrency=4",
        f"llama=llama-server:{upstream}/v1,models={LLAMA},concurrency=4",
    ]
    app = create_app(
        Settings(
            data_dir=str(data), no_embedded=True, engine=engines, log_level="warning", **settings
        )
    )
    server = serve_in_thread(app)

    def ready() -> bool:
        return httpx.get(server.url + "/health", timeout=2).status_code == 200

    until(ready, 60, "the front's /health", poll=0.05)
    return Front(server, OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0))


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Iterator[Front]:
    f = start_front(tmp_path_factory.mktemp("front"), upstream)
    yield f
    f.server.stop()


@pytest.fixture(scope="module")
def vllm_clients_front(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Iterator[Front]:
    f = start_front(tmp_path_factory.mktemp("front-r"), upstream, reasoning_field="reasoning")
    yield f
    f.server.stop()


def echoed(content: str | None) -> dict[str, Any]:
    """The reasoning controls the upstream says it was sent."""
    said = json.loads(content or "{}")
    return {k: v for k, v in said.items() if k not in ("model", "max_tokens", "stream_options")}


@pytest.mark.parametrize("model", [VLLM, INLINE, LLAMA])
def test_an_online_thought_is_reasoning_content_and_the_controls_go_each_kinds_way(
    front: Front, model: str
) -> None:
    c = front.client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "2+2?"}], max_tokens=50, **ASKED
    )
    message = c.choices[0].message
    assert message.model_extra == {"reasoning_content": THOUGHT}
    assert echoed(message.content) == PASSED[model]
    assert c.usage is not None and c.usage.completion_tokens_details is not None
    assert c.usage.completion_tokens_details.reasoning_tokens == COUNTED[model]


@pytest.mark.parametrize("model", [VLLM, INLINE, LLAMA])
def test_a_streamed_thought_is_reasoning_content(front: Front, model: str) -> None:
    stream = front.client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "2+2?"}],
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
        **ASKED,
    )
    chunks = list(stream)
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == (
        THOUGHT
    )
    assert not any("reasoning" in (d.model_extra or {}) for d in deltas)
    assert echoed("".join(d.content or "" for d in deltas)) == PASSED[model]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == COUNTED[model]


def test_a_responses_answer_keeps_its_reasoning_item(front: Front) -> None:
    r = front.client.responses.create(
        model=LLAMA, input="2+2?", reasoning={"effort": "high"}, max_output_tokens=50
    )
    reasoning, message = r.output
    assert (reasoning.type, message.type) == ("reasoning", "message")
    assert reasoning.content is not None
    assert reasoning.content[0].text == THOUGHT
    # llama-server runs Responses on its chat path: it reads the effort as `reasoning_effort`.
    assert echoed(r.output_text) == {
        "reasoning": {"effort": "high"},
        "reasoning_effort": "high",
        "max_output_tokens": 50,
    }
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens is None


def test_a_batch_lines_thought_is_reasoning_content_and_a_bad_effort_its_400(
    front: Front,
) -> None:
    c = front.client
    ids = {
        model: sdk_batch(
            c, [batch_line(model, "2+2?", model=model, max_tokens=50, **ASKED["extra_body"])]
        ).id
        for model in (INLINE, LLAMA)  # a batch names one model
    }
    # An effort out of the SDK's values fails its batch at validation, naming the line.
    bad = sdk_batch(
        c,
        [
            batch_line("good", "2+2?", model=LLAMA, max_tokens=50),
            batch_line("bad", "2+2?", model=LLAMA, reasoning_effort="extreme"),
        ],
    ).id
    for model, batch_id in ids.items():
        b = wait_for_status(c.batches.retrieve, batch_id, FINISHED)
        assert b.request_counts is not None and b.request_counts.completed == 1, b
        (line,) = jsonl_lines(c.files.content(b.output_file_id or "").text)
        message = line["response"]["body"]["choices"][0]["message"]
        assert message["reasoning_content"] == THOUGHT and "reasoning" not in message
        expected = {k: v for k, v in PASSED[model].items() if k != "reasoning_effort"}
        assert echoed(message["content"]) == expected
    b = wait_for_status(c.batches.retrieve, bad, {"failed"})
    assert b.errors is not None and b.errors.data is not None
    (error,) = b.errors.data
    assert (error.line, error.param) == (2, "body.reasoning_effort")


def test_a_parameter_the_upstream_cannot_take_is_a_400_naming_it(front: Front) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        front.client.chat.completions.create(
            model=VLLM,
            messages=[{"role": "user", "content": "2+2?"}],
            extra_body={"thinking_token_budget": -5},
        )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "thinking_token_budget"  # type: ignore[index]


def test_with_reasoning_field_reasoning_the_thought_is_reasoning(vllm_clients_front: Front) -> None:
    c = vllm_clients_front.client
    ask = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 50}
    answer = c.chat.completions.create(model=LLAMA, **ask)
    assert answer.choices[0].message.model_extra == {"reasoning": THOUGHT}
    stream = c.chat.completions.create(model=INLINE, stream=True, **ask)
    deltas = [ch.choices[0].delta for ch in stream if ch.choices]
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == THOUGHT
    assert not any("reasoning_content" in (d.model_extra or {}) for d in deltas)
    b = sdk_batch(c, [batch_line("v", "2+2?", model=VLLM, max_tokens=50)])
    b = wait_for_status(c.batches.retrieve, b.id, FINISHED)
    (line,) = jsonl_lines(c.files.content(b.output_file_id or "").text)
    message = line["response"]["body"]["choices"][0]["message"]
    assert message["reasoning"] == THOUGHT and "reasoning_content" not in message
