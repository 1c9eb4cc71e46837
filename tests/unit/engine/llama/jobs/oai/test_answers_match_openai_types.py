"""The OpenAI bodies and chunks the engine answers with, checked against openai's own types."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.engine.base import Priority
from app.engine.llama.jobs.jobs import Choice, Job
from app.engine.llama.jobs.oai import answers
from app.wire.endpoints import CHAT, COMPLETIONS

MODEL, FP = "SmolLM2-135M-Instruct.Q4_1", "fp_0123456789"


def chat_job(*, logprobs: bool = False, n: int = 1) -> Job:
    job = Job(CHAT, {}, Priority.ONLINE, None)
    job.prompts = [[1, 2, 3, 4, 5, 6]]
    job.cached_tokens = 4
    job.params.logprobs = logprobs
    job.params.n = n
    job.choices = [
        Choice(i, text=f"Paris {i}.", completion_tokens=3, finish_reason="stop") for i in range(n)
    ]
    return job


def completion_job(*, echo: bool = False, logprobs: bool = False) -> Job:
    job = Job(COMPLETIONS, {}, Priority.BATCH, None)
    job.prompt_texts = ["Once upon", "The sky"]
    job.prompts = [[1, 2], [3, 4, 5]]
    job.params.n = 2
    job.echo = echo
    job.params.logprobs = logprobs
    job.choices = [
        Choice(i, text=f" text {i}", completion_tokens=i + 1, finish_reason="length")
        for i in range(4)
    ]
    return job


def entry(token: str, logprob: float, *alts: tuple[str, float]) -> dict:
    return answers.token_logprob(token.encode(), logprob, [(t.encode(), lp) for t, lp in alts])


def test_chat_completion_body_and_usage() -> None:
    job = chat_job(logprobs=True, n=2)
    job.choices[0].logprobs = [entry("Par", -0.1, ("Par", -0.1), ("Lon", -2.5)), entry("is", -0.2)]
    body = answers.completion(job, MODEL, FP)
    parsed = ChatCompletion.model_validate(body)
    assert parsed.object == "chat.completion" and parsed.id.startswith("chatcmpl-")
    assert (parsed.model, parsed.system_fingerprint, parsed.created) == (MODEL, FP, job.created)
    assert [c.index for c in parsed.choices] == [0, 1]
    message = parsed.choices[0].message
    assert (message.role, message.content, message.refusal) == ("assistant", "Paris 0.", None)
    assert parsed.choices[0].finish_reason == "stop"
    lp = parsed.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert [(e.token, e.logprob, e.bytes) for e in lp.content] == [
        ("Par", -0.1, list(b"Par")),
        ("is", -0.2, list(b"is")),
    ]
    assert [(t.token, t.logprob) for t in lp.content[0].top_logprobs] == [
        ("Par", -0.1),
        ("Lon", -2.5),
    ]
    # The prompt counts once for all n choices; the cached part is reported apart, and the
    # thought's tokens (none: this model does not think) within the completion's.
    assert body["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 6,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert answers.completion(chat_job(), MODEL, FP)["choices"][0]["logprobs"] is None


def test_text_completion_body_echo_and_logprobs() -> None:
    job = completion_job(echo=True, logprobs=True)
    job.choices[2].logprobs = [entry(" bl", -0.5, (" bl", -0.5)), entry("ue", -0.25)]
    body = answers.completion(job, MODEL, FP)
    parsed = Completion.model_validate(body)
    assert parsed.object == "text_completion" and parsed.id.startswith("cmpl-")
    # n=2 per prompt: choices 0-1 answer the first prompt, 2-3 the second, echoed in front.
    assert [c.text for c in parsed.choices] == [
        "Once upon text 0",
        "Once upon text 1",
        "The sky text 2",
        "The sky text 3",
    ]
    assert all(c.finish_reason == "length" for c in parsed.choices)
    lp = parsed.choices[2].logprobs
    assert lp is not None
    assert lp.tokens == [" bl", "ue"] and lp.token_logprobs == [-0.5, -0.25]
    assert lp.top_logprobs == [{" bl": -0.5}, {}]
    assert lp.text_offset == [0, 3]
    # Completions report no cached-token details.
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
    plain = answers.completion(completion_job(), MODEL, FP)
    assert plain["choices"][0]["text"] == " text 0" and plain["choices"][0]["logprobs"] is None


def test_both_bodies_share_one_envelope() -> None:
    chat = answers.completion(chat_job(), MODEL, FP)
    text = answers.completion(completion_job(), MODEL, FP)
    keys = ["id", "object", "created", "model", "choices", "usage", "system_fingerprint"]
    assert list(chat) == list(text) == keys


def test_chat_stream_role_chunk_then_deltas_then_the_closing_chunk() -> None:
    job = chat_job()
    choice = Choice(0)
    first = answers.choice_chunks(job, choice, "Par", MODEL, FP)
    assert [c["choices"][0]["delta"] for c in first] == [
        {"role": "assistant", "content": ""},
        {"content": "Par"},
    ]
    choice.started = True
    assert [
        c["choices"][0]["delta"] for c in answers.choice_chunks(job, choice, "is", MODEL, FP)
    ] == [{"content": "is"}]
    choice.finish_reason = "stop"
    (closing,) = answers.choice_chunks(job, choice, None, MODEL, FP)
    assert closing["choices"][0]["delta"] == {} and closing["choices"][0]["finish_reason"] == "stop"
    tail = answers.usage_chunk(job, MODEL, FP)
    assert tail["choices"] == [] and tail["usage"] == answers.usage(job)
    for chunk in [*first, closing, tail]:
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert parsed.object == "chat.completion.chunk" and parsed.id == job.id
        assert (parsed.model, parsed.system_fingerprint) == (MODEL, FP)
    assert all(c["choices"][0]["finish_reason"] is None for c in first)


def test_text_completion_stream_chunks() -> None:
    job = completion_job()
    choice = Choice(3)
    (delta,) = answers.choice_chunks(job, choice, " once", MODEL, FP)
    choice.finish_reason = "length"
    (closing,) = answers.choice_chunks(job, choice, None, MODEL, FP)
    # openai's Completion type wants a finish_reason, which OpenAI's own stream leaves null
    # until a choice's closing chunk: only that one validates as a whole Completion.
    assert Completion.model_validate(closing).object == "text_completion"
    assert {k: v for k, v in delta.items() if k != "choices"} == {
        k: v for k, v in closing.items() if k != "choices"
    }
    assert delta["choices"] == [
        {"index": 3, "text": " once", "logprobs": None, "finish_reason": None}
    ]
    assert closing["choices"] == [
        {"index": 3, "text": "", "logprobs": None, "finish_reason": "length"}
    ]
    tail = answers.usage_chunk(job, MODEL, FP)
    assert Completion.model_validate(tail).usage is not None and tail["choices"] == []


def test_embedding_list_as_floats_and_base64() -> None:
    vectors = [np.array([0.6, 0.8], dtype=np.float32), np.array([1.0, 0.0], dtype=np.float32)]
    body = answers.embedding_list(vectors, 7, MODEL, base64_out=False)
    parsed = CreateEmbeddingResponse.model_validate(body)
    assert parsed.object == "list" and parsed.model == MODEL
    assert [d.index for d in parsed.data] == [0, 1]
    assert parsed.data[0].embedding == pytest.approx([0.6, 0.8])
    assert (parsed.usage.prompt_tokens, parsed.usage.total_tokens) == (7, 7)
    packed = answers.embedding_list(vectors, 7, MODEL, base64_out=True)
    raw = base64.b64decode(packed["data"][1]["embedding"])
    assert struct.unpack("<2f", raw) == (1.0, 0.0)
