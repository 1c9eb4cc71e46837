"""Request bodies -> tasks and parameter errors, with a stand-in vocabulary and template."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from app.engine.base import EngineError, Priority
from app.engine.llama.jobs.jobs import Job, Task
from app.engine.llama.jobs.oai.chat_template import normalise_messages
from app.engine.llama.jobs.prepare import Preparer, is_token_list
from app.engine.reasoning import THINKING, ThinkingFormat
from app.wire.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES

BOS = 1


class Letters:
    """A vocabulary of one token per character: token id = code point + 2."""

    n_vocab = 300
    bos = BOS

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        return ([BOS] if add_special and text else []) + [ord(c) + 2 for c in text]

    def piece(self, token: int, special: bool = False) -> bytes:
        return chr(token - 2).encode()


class Template:
    thinking = None  # a model that does not reason

    def render(
        self,
        messages: Any,
        plan: Any = None,
        media: Any = None,
        model: str = "",
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def stop_strings(self) -> list[str]:
        return ["<end>"]


def prepare(endpoint: str, body: Any, *, ctx: int = 64, slots: int = 4) -> tuple[Job, list[Task]]:
    job = Job(endpoint, body, Priority.BATCH, None)
    preparer = Preparer(Letters(), Template(), ctx_per_slot=ctx, n_slots=slots, embedding_dim=8)
    return job, preparer.prepare(job, itertools.count())


def refused(endpoint: str, body: Any, **kw: Any) -> EngineError:
    with pytest.raises(EngineError) as caught:
        prepare(endpoint, body, **kw)
    assert caught.value.status_code == 400
    return caught.value


def test_a_chat_body_becomes_one_templated_prompt_with_the_template_stop() -> None:
    job, tasks = prepare(
        CHAT,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "stop": "!",
            "stream_options": {"include_usage": True},
        },
    )
    assert job.prompt_texts == ["<user>hi<assistant>"]
    assert job.prompts == [[ord(c) + 2 for c in "<user>hi<assistant>"]]  # no BOS for chat
    assert job.stop_strings == ["!", "<end>"] and job.include_usage
    assert [(t.prompt_index, t.choice_indices) for t in tasks] == [(0, [0])]
    assert len(job.choices) == job.unfinished == 1


def test_n_beyond_the_slots_is_split_into_groups_per_prompt() -> None:
    job, tasks = prepare(COMPLETIONS, {"prompt": ["ab", "cd"], "n": 5}, slots=2)
    assert [(t.prompt_index, t.choice_indices) for t in tasks] == [
        (0, [0, 1]),
        (0, [2, 3]),
        (0, [4]),
        (1, [5, 6]),
        (1, [7, 8]),
        (1, [9]),
    ]
    assert [t.seq_no for t in tasks] == list(range(6)) and job.unfinished == 10


def test_completion_prompts_as_text_token_lists_and_empty() -> None:
    job, _ = prepare(COMPLETIONS, {"prompt": [[74, 75], "hi", ""]})
    assert job.prompts == [[74, 75], [BOS, ord("h") + 2, ord("i") + 2], [BOS]]
    assert job.prompt_texts == ["HI", "hi", ""]  # token prompts are read back as text
    assert refused(COMPLETIONS, {"prompt": [[5, 400]]}).param == "prompt"  # outside the vocab
    for bad in (5, [], [True, False], [["a"]], None):
        error = refused(COMPLETIONS, {"prompt": bad})
        assert (error.param, error.code) == ("prompt", "invalid_type"), bad


def test_is_token_list() -> None:
    assert is_token_list([1, 2, 3])
    assert not is_token_list([]) and not is_token_list([1, True]) and not is_token_list("12")


def test_context_limits_name_the_parameter() -> None:
    error = refused(COMPLETIONS, {"prompt": "x" * 70})
    assert (error.code, error.param) == ("context_length_exceeded", "prompt")
    error = refused(CHAT, {"messages": [{"role": "user", "content": "x" * 70}]})
    assert (error.code, error.param) == ("context_length_exceeded", "messages")
    error = refused(COMPLETIONS, {"prompt": "x" * 10, "max_tokens": 60})
    assert (error.code, error.param) == ("context_length_exceeded", "max_tokens")
    assert "requested 71 tokens (11 in the prompt, 60 in the completion)" in error.message
    prepare(COMPLETIONS, {"prompt": "x" * 10, "max_tokens": 53})  # 64 exactly fits


def test_completion_only_refusals() -> None:
    assert refused(COMPLETIONS, {"prompt": "a", "suffix": "b"}).param == "suffix"
    assert refused(COMPLETIONS, {"prompt": "a", "echo": True, "logprobs": 1}).param == "echo"
    assert refused(CHAT, ["not", "an", "object"]).param == "body"


def test_embedding_inputs() -> None:
    job, tasks = prepare(EMBEDDINGS, {"input": ["ab", [5, 6, 7]], "encoding_format": "base64"})
    assert job.prompts == [[BOS, ord("a") + 2, ord("b") + 2], [5, 6, 7]]
    assert len(tasks) == 1 and tasks[0].choice_indices == []
    assert refused(EMBEDDINGS, {"input": "x", "dimensions": 4}).param == "dimensions"
    assert prepare(EMBEDDINGS, {"input": "x", "dimensions": 8})[0].prompts
    assert refused(EMBEDDINGS, {"input": "x", "encoding_format": "hex"}).param == "encoding_format"
    assert "input[1] is empty" in refused(EMBEDDINGS, {"input": ["a", ""]}).message
    assert refused(EMBEDDINGS, {"input": []}).code == "invalid_type"
    error = refused(EMBEDDINGS, {"input": "x" * 64})  # BOS makes it 65
    assert (error.code, error.param) == ("context_length_exceeded", "input")


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_a_lines_service_tier_is_checked_alike_on_chat_and_responses(endpoint: str) -> None:
    def body(tier: str) -> dict[str, Any]:
        if endpoint == CHAT:
            return {"messages": [{"role": "user", "content": "hi"}], "service_tier": tier}
        return {"input": "hi", "service_tier": tier}

    for tier in ("auto", "default", "flex"):
        assert prepare(endpoint, body(tier))[1]
    err = refused(endpoint, body("priority"))
    assert (err.param, err.code) == ("service_tier", "invalid_value")
    assert "'auto', 'default', 'flex'" in err.message


class Thinking(Template):
    """A template that opens each thought, as DeepSeek-R1's does."""

    thinking = ThinkingFormat(start="<think>", end="</think>")

    def render(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        return super().render(messages) + "<think>\n"


def test_a_thinking_models_budget_is_the_requests_or_else_the_servers() -> None:
    preparer = Preparer(
        Letters(), Thinking(), ctx_per_slot=64, n_slots=4, embedding_dim=8, thought_budget=8
    )
    ask = {"messages": [{"role": "user", "content": "hi"}]}
    for extra, budget in (
        ({}, 8),
        ({"thinking_token_budget": 3}, 3),
        ({"reasoning_effort": "low"}, 8),
    ):
        job = Job(CHAT, {**ask, **extra}, Priority.BATCH, None)
        preparer.prepare(job, itertools.count())
        assert job.thought_budget == budget
        # The closing tag's tokens, forced when the budget is spent.
        assert job.thought_close == [ord(c) + 2 for c in "</think>"]
        # The answer starts inside the thought; the template's newline after the tag counts.
        thought = job.choices[0].thought
        assert thought is not None and thought.state == THINKING and thought.inside == 1


def test_earlier_turns_keep_their_thought_for_the_template() -> None:
    turns = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning": "because"},
        {"role": "user", "content": "more"},
    ]
    assert normalise_messages(turns)[1] == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "because",
    }
    with pytest.raises(EngineError) as caught:
        normalise_messages([{**turns[1], "reasoning_content": 3}])
    assert caught.value.param == "messages[0].reasoning_content"
