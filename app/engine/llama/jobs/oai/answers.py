"""The OpenAI bodies and stream chunks the engine answers with, built from a finished `Job`.

Pure functions (llama.cpp server's to_json_oaicompat*): `chat.completion`, `text_completion`,
their stream chunks, the usage object, legacy completion logprobs and the embeddings list.
`model` is the served model's id and `fingerprint` its `system_fingerprint`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.llama.jobs.jobs import Choice, Job, ToolUse
from app.engine.llama.jobs.oai import responses_answer, tools
from app.wire.endpoints import CHAT, RESPONSES


def usage(job: Job) -> dict[str, Any]:
    """Token counts. OpenAI counts every prompt token, cached or not, and reports the cached
    part apart (chat only; a `response` has its own usage shape)."""
    if job.endpoint == RESPONSES:
        return responses_answer.usage(job)
    prompt = sum(len(p) for p in job.prompts)
    completion = sum(c.completion_tokens for c in job.choices)
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if job.endpoint == CHAT:
        out["prompt_tokens_details"] = {"cached_tokens": job.cached_tokens}
        # The thought's tokens are within completion_tokens, as OpenAI bills them.
        thought = sum(c.reasoning_tokens for c in job.choices)
        out["completion_tokens_details"] = {"reasoning_tokens": thought}
    return out


def token_logprob(
    piece: bytes, logprob: float, alternatives: list[tuple[bytes, float]]
) -> dict[str, Any]:
    """One sampled token's chat logprobs entry, with its most likely alternatives."""
    return {
        "token": piece.decode("utf-8", "replace"),
        "logprob": logprob,
        "bytes": list(piece),
        "top_logprobs": [
            {"token": p.decode("utf-8", "replace"), "logprob": lp, "bytes": list(p)}
            for p, lp in alternatives
        ],
    }


def completion_logprobs(choice: Choice) -> dict[str, Any]:
    """The legacy completions endpoint's logprobs: parallel lists and character offsets."""
    offsets, at = [], 0
    for e in choice.logprobs:
        offsets.append(at)
        at += len(e["token"])
    return {
        "tokens": [e["token"] for e in choice.logprobs],
        "token_logprobs": [e["logprob"] for e in choice.logprobs],
        "top_logprobs": [
            {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in choice.logprobs
        ],
        "text_offset": offsets,
    }


def _chat_choice(job: Job, c: Choice) -> dict[str, Any]:
    calls = tools.calls_of(job.tools, c.index, c.text)
    message: dict[str, Any] = {"role": "assistant", "content": c.text, "refusal": None}
    if calls:
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    return {
        "index": c.index,
        "message": message,
        "logprobs": {"content": c.logprobs, "refusal": None} if job.params.logprobs else None,
        "finish_reason": "tool_calls" if calls else c.finish_reason,
    }


def _text_choice(job: Job, c: Choice) -> dict[str, Any]:
    echoed = job.prompt_texts[c.index // job.params.n] if job.echo else ""
    return {
        "index": c.index,
        "text": echoed + c.text,
        "logprobs": completion_logprobs(c) if job.params.logprobs else None,
        "finish_reason": c.finish_reason,
    }


def completion(job: Job, model: str, fingerprint: str) -> dict[str, Any]:
    """The whole response: a `chat.completion`, a `text_completion` or a `response`, by the
    job's endpoint."""
    if job.endpoint == RESPONSES:
        return responses_answer.body(job, model)
    chat = job.endpoint == CHAT
    choice = _chat_choice if chat else _text_choice
    return {
        "id": job.id,
        "object": "chat.completion" if chat else "text_completion",
        "created": job.created,
        "model": model,
        "choices": [choice(job, c) for c in job.choices],
        "usage": usage(job),
        "system_fingerprint": fingerprint,
    }


def _chunk(job: Job, model: str, fingerprint: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": job.id,
        "object": "chat.completion.chunk" if job.endpoint == CHAT else "text_completion",
        "created": job.created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
    }


def choice_chunks(
    job: Job,
    choice: Choice,
    text: str | None,
    model: str,
    fingerprint: str,
    thought: bool = False,
) -> list[dict[str, Any]]:
    """The stream chunks for one delta (`text`; with `thought`, of the thought) or the
    closing chunk (None) of a choice.

    A chat choice's first delta is preceded by its role chunk (until `choice.started`).
    A `response` streams its own events (responses_answer.stream_events).
    """
    if job.endpoint == RESPONSES:
        return responses_answer.stream_events(job, choice, text, model, thought=thought)
    if thought:
        return _thought_chunks(job, choice, text or "", model, fingerprint)
    if job.tools is not None and job.tools.active:
        return _tool_choice_chunks(job, job.tools, choice, text, model, fingerprint)
    finish = None if text is not None else choice.finish_reason
    if job.endpoint != CHAT:
        delta = {
            "index": choice.index,
            "text": text or "",
            "logprobs": None,
            "finish_reason": finish,
        }
        return [_chunk(job, model, fingerprint, [delta])]
    chunks = []
    if not choice.started:
        role = {"role": "assistant", "content": ""}
        chunks.append(
            _chunk(
                job,
                model,
                fingerprint,
                [{"index": choice.index, "delta": role, "logprobs": None, "finish_reason": None}],
            )
        )
    content = {"content": text} if text is not None else {}
    chunks.append(
        _chunk(
            job,
            model,
            fingerprint,
            [{"index": choice.index, "delta": content, "logprobs": None, "finish_reason": finish}],
        )
    )
    return chunks


def _thought_chunks(
    job: Job, choice: Choice, text: str, model: str, fingerprint: str
) -> list[dict[str, Any]]:
    """A delta of the thought: `delta.reasoning_content`, after the role chunk."""

    def one(delta: dict[str, Any]) -> dict[str, Any]:
        entry = {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}
        return _chunk(job, model, fingerprint, [entry])

    opening = [] if choice.started else [one({"role": "assistant", "content": ""})]
    return [*opening, one({"reasoning_content": text})]


def _tool_choice_chunks(
    job: Job, plan: ToolUse, choice: Choice, text: str | None, model: str, fingerprint: str
) -> list[dict[str, Any]]:
    """A chat choice that may be a call: its text is held back until it shows what it is.
    Opening with `{` it is a call, sent whole at the end as `tool_calls`; anything else is
    content, streamed from there on."""
    mode = plan.modes.get(choice.index)

    def one(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        entry = {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _chunk(job, model, fingerprint, [entry])

    if text is not None:
        if mode == "text":
            return [one({"content": text})]
        if mode is None and (kind := tools.answer_kind(choice.text)):
            plan.modes[choice.index] = kind
            if kind == "text":
                return [one({"role": "assistant", "content": choice.text})]
        return []
    calls = tools.calls_of(plan, choice.index, choice.text)
    if calls:
        listed = [{"index": k, **call} for k, call in enumerate(calls)]
        return [
            one({"role": "assistant", "content": None, "tool_calls": listed}),
            one({}, "tool_calls"),
        ]
    opening = [] if mode == "text" else [one({"role": "assistant", "content": choice.text})]
    return [*opening, one({}, choice.finish_reason)]


def usage_chunk(job: Job, model: str, fingerprint: str) -> dict[str, Any]:
    """The last chunk of a stream with `stream_options.include_usage`: no choices, the usage."""
    return {**_chunk(job, model, fingerprint, []), "usage": usage(job)}


def embedding_list(
    vectors: Sequence[np.ndarray], n_tokens: int, model: str, *, base64_out: bool
) -> dict[str, Any]:
    """The embeddings response: one `embedding` per input, floats or little-endian base64."""
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
            if base64_out
            else [float(x) for x in v],
        }
        for i, v in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
