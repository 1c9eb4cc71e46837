"""`/v1/responses` over the chat path, the answer side: a finished chat job -> the
`response` object, or its stream events (responses_request.py reads the request).
"""

from __future__ import annotations

import time
from typing import Any

from app.engine.llama.jobs.jobs import Choice, Job, ResponseRequest
from app.engine.llama.jobs.oai import tools
from app.engine.reasoning import THINKING

# -- response ------------------------------------------------------------------------------


def usage(job: Job) -> dict[str, Any]:
    """Responses usage: cached prompt tokens (the prefix cache) in input_tokens_details."""
    prompt = sum(len(p) for p in job.prompts)
    completion = sum(c.completion_tokens for c in job.choices)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": job.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": sum(c.reasoning_tokens for c in job.choices)},
        "total_tokens": prompt + completion,
    }


def _message_item(state: ResponseRequest, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": state.message_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part] if status != "in_progress" else [],
    }


def _call_item(call: dict[str, Any], status: str, arguments: str | None = None) -> dict[str, Any]:
    fn = call["function"]
    return {
        "id": "fc_" + call["id"].removeprefix("call_"),
        "type": "function_call",
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn["arguments"] if arguments is None else arguments,
        "status": status,
    }


def _reasoning_item(state: ResponseRequest, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {
        "id": state.reasoning_id,
        "type": "reasoning",
        "summary": [],
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def _cut_thinking(choice: Choice) -> bool:
    """The answer ended inside its thought (out of room): it has no answer proper."""
    return choice.thought is not None and choice.thought.state == THINKING


def _output(job: Job, choice: Choice) -> list[dict[str, Any]]:
    assert job.response is not None
    cut = _cut_thinking(choice)
    out = []
    if choice.reasoning:
        status = "incomplete" if cut else "completed"
        out.append(_reasoning_item(job.response, choice.reasoning, status))
    if cut:
        return out  # the thought ran out of room: no answer, and the thought is not one
    calls = tools.calls_of(job.tools, choice.index, choice.text)
    if calls:
        return [*out, *(_call_item(c, "completed") for c in calls)]
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    return [*out, _message_item(job.response, choice.text, status)]


def body(job: Job, model: str, *, final: bool = True) -> dict[str, Any]:
    """The `response` object: finished (final) or as it stands at `response.created`."""
    state = job.response
    assert state is not None
    choice = job.choices[0]
    status, incomplete = "in_progress", None
    if final:
        if state.completed_at is None:
            state.completed_at = int(time.time())
        cut = choice.finish_reason == "length" and not tools.calls_of(
            job.tools, choice.index, choice.text
        )
        status = "incomplete" if cut else "completed"
        incomplete = {"reason": "max_output_tokens"} if cut else None
    return {
        "id": job.id,
        "object": "response",
        "created_at": job.created,
        "status": status,
        "background": False,
        "completed_at": state.completed_at if final and status == "completed" else None,
        "error": None,
        "incomplete_details": incomplete,
        "model": model,
        "output": _output(job, choice) if final else [],
        "previous_response_id": None,
        "reasoning": state.reasoning,
        "service_tier": "default",
        "truncation": "disabled",
        "usage": usage(job) if final else None,
        **state.echo,
    }


# -- stream --------------------------------------------------------------------------------


def _event(state: ResponseRequest, kind: str, **fields: Any) -> dict[str, Any]:
    event = {"type": kind, "sequence_number": state.sequence, **fields}
    state.sequence += 1
    return event


def _open_message(state: ResponseRequest, out: list[dict[str, Any]]) -> None:
    _close_thought(state, out)
    state.mode = "text"
    out.append(
        _event(
            state,
            "response.output_item.added",
            output_index=state.first,
            item=_message_item(state, "", "in_progress"),
        )
    )
    out.append(
        _event(
            state,
            "response.content_part.added",
            item_id=state.message_id,
            output_index=state.first,
            content_index=0,
            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        )
    )


def _delta(state: ResponseRequest, text: str) -> dict[str, Any]:
    return _event(
        state,
        "response.output_text.delta",
        item_id=state.message_id,
        output_index=state.first,
        content_index=0,
        delta=text,
        logprobs=[],
    )


_THOUGHT_IDS = {"output_index": 0, "content_index": 0}


def _open_thought(state: ResponseRequest, out: list[dict[str, Any]]) -> None:
    state.thought = ""
    item = _reasoning_item(state, "", "in_progress")
    out.append(_event(state, "response.output_item.added", output_index=0, item=item))
    part = {"type": "reasoning_text", "text": ""}
    out.append(
        _event(
            state,
            "response.content_part.added",
            item_id=state.reasoning_id,
            part=part,
            **_THOUGHT_IDS,
        )
    )


def _close_thought(
    state: ResponseRequest, out: list[dict[str, Any]], status: str = "completed"
) -> None:
    """The reasoning item's closing events, once, when the answer begins (or ends)."""
    if state.thought is None or state.thought_closed:
        return
    text = state.thought
    ids = {"item_id": state.reasoning_id, **_THOUGHT_IDS}
    out.append(_event(state, "response.reasoning_text.done", text=text, **ids))
    part = {"type": "reasoning_text", "text": text}
    out.append(_event(state, "response.content_part.done", part=part, **ids))
    item = _reasoning_item(state, text, status)
    out.append(_event(state, "response.output_item.done", output_index=0, item=item))
    state.thought_closed = True


def _thought_events(state: ResponseRequest, text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if state.thought is None:
        _open_thought(state, out)
    state.thought = (state.thought or "") + text
    ids = {"item_id": state.reasoning_id, **_THOUGHT_IDS}
    out.append(_event(state, "response.reasoning_text.delta", delta=text, **ids))
    return out


def stream_events(
    job: Job, choice: Choice, text: str | None, model: str, *, thought: bool = False
) -> list[dict[str, Any]]:
    """The events for one text delta (with `thought`, of the thought: the reasoning item's),
    or for the end of the answer (`text` None).

    With active tools the text is held back until it shows what it is: an answer opening
    with `{` is a call (sent whole at the end as a function_call item), anything else is
    a message streamed from there on.
    """
    state = job.response
    assert state is not None
    out: list[dict[str, Any]] = []
    if not state.opened:
        state.opened = True
        opening = body(job, model, final=False)
        out.append(_event(state, "response.created", response=opening))
        out.append(_event(state, "response.in_progress", response=opening))
    if thought:
        return out + _thought_events(state, text or "")
    calling = job.tools is not None and job.tools.active
    if text is not None:
        if state.mode == "text":
            out.append(_delta(state, text))
        elif not calling:
            _open_message(state, out)
            out.append(_delta(state, text))
        elif state.mode is None and (kind := tools.answer_kind(choice.text)):
            if kind == "call":
                state.mode = "call"
            else:
                _open_message(state, out)
                out.append(_delta(state, choice.text))
        return out
    return out + _end_events(job, choice, model)


def _end_events(job: Job, choice: Choice, model: str) -> list[dict[str, Any]]:
    """The events that close the answer: its thought's item, its calls or its message, and
    `response.completed` (or `.incomplete`)."""
    state = job.response
    assert state is not None
    out: list[dict[str, Any]] = []
    final = body(job, model)
    if _cut_thinking(choice):
        _close_thought(state, out, "incomplete")
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [*out, _event(state, kind, response=final)]
    _close_thought(state, out)
    calls = tools.calls_of(job.tools, choice.index, choice.text)
    if calls:
        for k, call in enumerate(calls, start=state.first):
            item = _call_item(call, "in_progress", arguments="")
            out.append(_event(state, "response.output_item.added", output_index=k, item=item))
            args = call["function"]["arguments"]
            for kind, key in (
                ("response.function_call_arguments.delta", "delta"),
                ("response.function_call_arguments.done", "arguments"),
            ):
                out.append(_event(state, kind, item_id=item["id"], output_index=k, **{key: args}))
            done = _call_item(call, "completed")
            out.append(_event(state, "response.output_item.done", output_index=k, item=done))
    else:
        if state.mode != "text":
            _open_message(state, out)
            if choice.text:
                out.append(_delta(state, choice.text))
        item = final["output"][-1]
        part = item["content"][0]
        ids = {"item_id": state.message_id, "output_index": state.first, "content_index": 0}
        out.append(_event(state, "response.output_text.done", text=choice.text, logprobs=[], **ids))
        out.append(_event(state, "response.content_part.done", part=part, **ids))
        out.append(_event(state, "response.output_item.done", output_index=state.first, item=item))
    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
    out.append(_event(state, kind, response=final))
    return out


__all__ = ["body", "stream_events", "usage"]
