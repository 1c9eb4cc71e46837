"""Thinking models behind an upstream (app/engine/upstream/kinds/thoughts.py): each kind
writes a request's reasoning controls its server's way, refuses what its server cannot take
with a 400 that names the parameter, and reads any server's thought as `reasoning_content`.
The end-to-end path (the SDK, a front, a fake vLLM and llama-server) is
tests/e2e/test_upstream_reasoning.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config.upstreams import KINDS, UpstreamSpec
from app.engine.base import EngineError
from app.engine.upstream.kinds import kind_of
from app.engine.upstream.kinds.openai import EventReader, OpenAIKind
from app.engine.upstream.kinds.thoughts import WIRES, StreamThoughts, incoming
from app.wire.endpoints import CHAT, COMPLETIONS, RESPONSES

MESSAGES = [{"role": "user", "content": "Why?"}]


def sent(kind: str, body: dict[str, Any], endpoint: str = CHAT) -> dict[str, Any]:
    """What an upstream of `kind` is sent for `body`, less the model and messages."""
    wire = kind_of(UpstreamSpec(name="u", url="http://h/v1", kind=kind))
    out = json.loads(wire.encode(endpoint, {"model": "m", "messages": MESSAGES, **body}))
    return {k: v for k, v in out.items() if k not in ("model", "messages")}


def test_every_kind_of_the_openai_wire_has_its_row_in_the_table() -> None:
    openai_kinds = {name for name, path in KINDS.items() if path.startswith(OpenAIKind.__module__)}
    assert openai_kinds == set(WIRES)
    for name in openai_kinds:
        kind = kind_of(UpstreamSpec(name="u", url="http://h/v1", kind=name))
        assert isinstance(kind, OpenAIKind) and kind.wire is WIRES[name]


ASKED = {
    "reasoning_effort": "low",
    "chat_template_kwargs": {"thinking": True},
    "thinking_token_budget": 64,
}


@pytest.mark.parametrize(
    ("kind", "wants"),
    [
        ("openai", ASKED),
        ("batchyard", ASKED),
        ("vllm", ASKED),
        (
            "llama-server",
            {
                "reasoning_effort": "low",
                "chat_template_kwargs": {"thinking": True},
                "reasoning_budget_tokens": 64,
            },
        ),
    ],
)
def test_each_kind_gets_the_controls_its_way(kind: str, wants: dict[str, Any]) -> None:
    assert sent(kind, ASKED) == wants


def test_sglang_gets_the_effort_as_template_variables_and_separate_reasoning() -> None:
    assert sent("sglang", {}) == {"separate_reasoning": True}
    assert sent("sglang", {"reasoning_effort": "none"}) == {
        "separate_reasoning": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    # The request's own variables win over what its effort says, as in the embedded engine.
    assert sent(
        "sglang", {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}
    ) == {
        "separate_reasoning": True,
        "chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": False},
    }


def test_ollama_gets_the_effort_and_enable_thinking_as_an_effort() -> None:
    assert sent("ollama", {"reasoning_effort": "xhigh"}) == {"reasoning_effort": "xhigh"}
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert sent("ollama", off) == {"reasoning_effort": "none"}
    assert sent("ollama", {**off, "reasoning_effort": "high"}) == {"reasoning_effort": "none"}
    on = {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"}
    assert sent("ollama", on) == {}
    assert sent("ollama", off, RESPONSES) == {"reasoning": {"effort": "none"}}


def test_responses_keep_reasoning_and_llama_server_reads_its_effort_on_the_chat_path() -> None:
    asked = {"reasoning": {"effort": "medium", "summary": "auto"}}
    assert sent("vllm", asked, RESPONSES) == asked
    assert sent("llama-server", asked, RESPONSES) == {**asked, "reasoning_effort": "medium"}


def test_no_budget_is_what_each_server_reads_as_none() -> None:
    unbounded = {"thinking_token_budget": -1}
    assert sent("batchyard", unbounded) == unbounded
    assert sent("llama-server", unbounded) == {"reasoning_budget_tokens": -1}
    assert sent("vllm", unbounded) == {}
    assert sent("ollama", unbounded) == {}


def test_a_body_without_controls_goes_as_it_is() -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 3}
    for kind in ("vllm", "llama-server", "ollama"):
        assert json.loads(kind_of(UpstreamSpec("u", "http://h", kind)).encode(CHAT, body)) == body
    completion = {"model": "m", "prompt": "Hi", "reasoning_effort": "bogus"}
    assert (
        json.loads(kind_of(UpstreamSpec("u", "http://h", "vllm")).encode(COMPLETIONS, completion))
        == completion
    )


@pytest.mark.parametrize(
    ("kind", "body", "param", "code"),
    [
        ("vllm", {"reasoning_effort": "extreme"}, "reasoning_effort", "invalid_value"),
        ("ollama", {"reasoning_effort": 3}, "reasoning_effort", "invalid_value"),
        ("vllm", {"thinking_token_budget": -5}, "thinking_token_budget", "invalid_value"),
        ("vllm", {"chat_template_kwargs": "on"}, "chat_template_kwargs", "invalid_type"),
        (
            "sglang",
            {"chat_template_kwargs": {"enable_thinking": "no"}},
            "chat_template_kwargs.enable_thinking",
            "invalid_type",
        ),
        ("ollama", {"thinking_token_budget": 64}, "thinking_token_budget", "unsupported_parameter"),
        ("sglang", {"thinking_token_budget": 0}, "thinking_token_budget", "unsupported_parameter"),
        (
            "ollama",
            {"chat_template_kwargs": {"thinking": True}},
            "chat_template_kwargs",
            "unsupported_parameter",
        ),
    ],
)
def test_what_a_kind_cannot_send_is_a_400_naming_it(
    kind: str, body: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(EngineError) as caught:
        sent(kind, body)
    assert (caught.value.status_code, caught.value.param, caught.value.code) == (400, param, code)


def test_a_responses_effort_is_checked_under_its_own_name() -> None:
    for reasoning, param in (({"effort": "lots"}, "reasoning.effort"), ("high", "reasoning")):
        with pytest.raises(EngineError) as caught:
            sent("vllm", {"reasoning": reasoning}, RESPONSES)
        assert (caught.value.status_code, caught.value.param) == (400, param)


def chat(message: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    return {**body, "usage": usage or {"prompt_tokens": 5, "completion_tokens": 9}}


def test_every_servers_thought_is_reasoning_content() -> None:
    vllm = incoming(CHAT, chat({"content": "4", "reasoning": "2+2", "reasoning_content": None}))
    assert vllm["choices"][0]["message"] == {"content": "4", "reasoning_content": "2+2"}
    llama = incoming(CHAT, chat({"content": "4", "reasoning_content": "2+2"}))
    assert llama["choices"][0]["message"] == {"content": "4", "reasoning_content": "2+2"}
    inline = incoming(CHAT, chat({"content": "\n<think>\n2+2\n</think>\n\n4"}))
    assert inline["choices"][0]["message"] == {"content": "4", "reasoning_content": "2+2"}
    plain = incoming(CHAT, chat({"content": "I <think> so", "reasoning": None}))
    assert plain["choices"][0]["message"] == {"content": "I <think> so"}
    assert "completion_tokens_details" not in plain["usage"]


def test_a_count_is_kept_and_a_missing_one_is_null() -> None:
    counted = {"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 6}}
    kept = incoming(CHAT, chat({"content": "4", "reasoning": "2+2"}, counted))
    assert kept["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    missing = incoming(CHAT, chat({"content": "4", "reasoning_content": "2+2"}))
    assert missing["usage"]["completion_tokens_details"] == {"reasoning_tokens": None}
    # Ollama's Responses say 0 beside a thought: not a count a thought can have.
    item = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]}
    usage = {"output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0}}
    response = incoming(RESPONSES, {"object": "response", "output": [item], "usage": usage})
    assert response["output"] == [item]
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": None}


def delta(**fields: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields}]}


def streamed(chunks: list[dict[str, Any]]) -> tuple[str, str, list[dict[str, Any]]]:
    """(the thought, the answer) the chunks say once read, and the chunks."""
    thoughts = StreamThoughts()
    for chunk in chunks:
        thoughts.chunk(chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return (
        "".join(d.get("reasoning_content") or "" for d in deltas),
        "".join(d.get("content") or "" for d in deltas),
        chunks,
    )


def test_a_streamed_thought_left_inline_is_split_across_cut_tags() -> None:
    pieces = ["<th", "ink>", "2+", "2</th", "ink>", "\n\n4", " it is"]
    chunks = [delta(content=p) for p in pieces]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    chunks.append({"choices": [], "usage": {"completion_tokens": 7}})
    thought, answer, chunks = streamed(chunks)
    assert (thought, answer) == ("2+2", "4 it is")
    assert "reasoning" not in chunks[2]["choices"][0]["delta"]
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": None}


def test_a_streamed_reasoning_field_is_reasoning_content() -> None:
    chunks = [delta(role="assistant", content=""), delta(reasoning="2+"), delta(reasoning="2")]
    chunks += [delta(content="<think> is a tag"), delta(content="", reasoning=None)]
    thought, answer, chunks = streamed(chunks)
    assert (thought, answer) == ("2+2", "<think> is a tag")
    assert all("reasoning" not in c["choices"][0]["delta"] for c in chunks)


def test_a_stream_read_whole_carries_its_thought() -> None:
    reader = EventReader(CHAT, "u")
    for chunk in [delta(reasoning="2+2"), delta(content="4")]:
        reader.read(b"data: " + json.dumps(chunk).encode())
    assert reader.body()["choices"][0]["message"] == {
        "role": "assistant",
        "content": "4",
        "reasoning_content": "2+2",
    }
