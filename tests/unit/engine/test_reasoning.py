"""A thinking model's output split into its thought and its answer (engine/reasoning.py),
fed as a decoding loop feeds it: one token's text at a time, tags cut anywhere."""

from __future__ import annotations

import pytest

from app.engine import reasoning
from app.engine.base import EngineError
from app.engine.reasoning import ANSWER, THINKING, ThinkingFormat, Thought

THINK = ThinkingFormat(start="<think>", end="</think>")
CHANNELS = reasoning.detect("{{ '<|channel|>' }}")
QWEN3 = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
    "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def run(thought: Thought, pieces: list[str]) -> tuple[str, str, int]:
    inner = answer = ""
    for piece in pieces:
        a, b = thought.feed(piece)
        inner, answer = inner + a, answer + b
    a, b = thought.finish()
    return inner + a, answer + b, thought.tokens


@pytest.mark.parametrize(
    ("pieces", "tokens"),
    [
        (["<think>", "Two and", " two.", "</think>", "\n\n", "Four."], 5),
        (["<", "think", ">Two", " and two.</", "think", ">\n", "\nFour."], 6),
        ([" <think>Two and two.</think>Four", "."], 1),
    ],
)
def test_tags_cut_anywhere_split_alike(pieces: list[str], tokens: int) -> None:
    # The thought's tokens: from the first of its opening tag to the white space after its
    # closing one; a token that carries both ends of a thought is the thought's.
    assert run(Thought(THINK), pieces) == ("Two and two.", "Four.", tokens)


def test_an_answer_without_a_thought_counts_no_thought_tokens() -> None:
    assert run(Thought(THINK), ["<", "b>bold</b>"]) == ("", "<b>bold</b>", 0)
    assert run(Thought(THINK), ["Four."]) == ("", "Four.", 0)


def test_a_thought_the_template_opened_starts_the_output() -> None:
    thought = Thought.for_prompt(THINK, "<|im_start|>assistant\n<think>\n")
    assert thought.state == THINKING
    assert run(thought, ["Two", " and two.", "</think>", "Four."]) == ("Two and two.", "Four.", 3)
    assert thought.inside == 2  # what a budget bounds: the tokens inside, not the tag


def test_a_thought_cut_off_is_never_the_answer() -> None:
    thought = Thought.for_prompt(THINK, "assistant\n<think>\n")
    assert run(thought, ["Two and", " two.</thi"]) == ("Two and two.</thi", "", 2)
    assert thought.thinking


def test_a_prompt_that_closed_the_thought_starts_at_the_answer() -> None:
    thought = Thought.for_prompt(THINK, "assistant\n<think>\n\n</think>\n\n")
    assert thought.state == ANSWER
    assert run(thought, ["<think>x</think>"]) == ("", "<think>x</think>", 0)


def test_gpt_oss_channels_put_analysis_apart_and_drop_the_final_header() -> None:
    assert CHANNELS is not None and CHANNELS.name == "channels"
    pieces = ["<|channel|>", "analysis", "<|message|>", "Think.", "<|end|>", "<|start|>"]
    pieces += ["assistant", "<|channel|>", "final", "<|message|>", "Answer."]
    assert run(Thought(CHANNELS), pieces) == ("Think.", "Answer.", 10)
    # Straight to the final channel: no thought.
    direct = ["<|channel|>", "final", "<|message|>", "Answer."]
    assert run(Thought(CHANNELS), direct) == ("", "Answer.", 0)


def test_templates_say_how_their_models_think() -> None:
    fmt = reasoning.detect(QWEN3, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    assert fmt is not None and (fmt.start, fmt.end, fmt.switch, fmt.opened) == (
        "<think>",
        "</think>",
        True,
        False,
    )
    opened = reasoning.detect("{{ '<think>\\n' }}", "<|im_start|>assistant\n<think>\n")
    assert opened is not None and opened.opened and not opened.switch
    magistral = reasoning.detect("[THINK]{{ x }}[/THINK]")
    assert magistral is not None and magistral.end == "[/THINK]"
    assert reasoning.detect("{{ messages }}") is None and reasoning.detect(None) is None


def test_whole_texts_split_as_streams_do() -> None:
    assert reasoning.split("<think>\nTwo.\n</think>\n\nFour.", reasoning.INLINE) == (
        "Two.",
        "Four.",
    )
    assert reasoning.split("Two.</think>Four.", reasoning.INLINE, opened=True) == ("Two.", "Four.")


def test_controls_turn_thinking_off_or_pass_the_effort_to_the_template() -> None:
    assert reasoning.request_controls({"reasoning_effort": "none"}).template_kwargs == {
        "enable_thinking": False
    }
    low = reasoning.request_controls({"reasoning_effort": "low", "thinking_token_budget": 32})
    assert (low.template_kwargs, low.budget) == ({"reasoning_effort": "low"}, 32)
    own = reasoning.request_controls(
        {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}
    )
    assert own.template_kwargs == {"enable_thinking": True}  # the request's own kwargs win
    assert reasoning.request_controls({}, default_budget=8).budget == 8
    assert reasoning.request_controls({"reasoning_format": "none"}).inline


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking_token_budget": -3}, "thinking_token_budget"),
        ({"thinking_token_budget": "8"}, "thinking_token_budget"),
        ({"reasoning_format": "hidden"}, "reasoning_format"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        (
            {"chat_template_kwargs": {"enable_thinking": "no"}},
            "chat_template_kwargs.enable_thinking",
        ),
    ],
)
def test_bad_controls_are_a_400_naming_the_parameter(body: dict[str, object], param: str) -> None:
    with pytest.raises(EngineError) as caught:
        reasoning.request_controls(body)
    assert (caught.value.status_code, caught.value.param) == (400, param)
