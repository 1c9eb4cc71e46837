"""Sampling parameters and stop-string matching, without a model."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.engine.base import EngineError
from app.engine.llama.binding.sampler import StopMatcher
from app.engine.llama.jobs.oai.sampling import parse_sampling


def feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


def test_stop_string_split_across_pieces_is_cut_and_excluded() -> None:
    matcher = StopMatcher(["END"])
    emitted = [matcher.feed(p) for p in ["Hello E", "N", "D and more"]]
    # "E" and "N" may start the stop string, so they are held back until it is decided.
    assert emitted == ["Hello ", "", ""]
    assert matcher.stopped
    assert matcher.flush() == ""


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("a E") == "a "
    assert matcher.feed("x") == "Ex"
    assert feed_all(StopMatcher(["END"]), ["tail E"]) == "tail E"
    assert not matcher.stopped


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(StopMatcher(["world", "lo"]), ["hello world"]) == "hel"


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("abc") == "abc"
    assert matcher.flush() == ""


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"seed": "7"}, "seed"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ],
)
def test_out_of_range_values_name_the_param(body: dict, param: str) -> None:
    with pytest.raises(EngineError) as caught:
        parse_sampling(body, chat=True, n_vocab=1000)
    err = caught.value
    assert err.status_code == 400
    assert err.param == param
    assert err.code in ("invalid_value", "invalid_type")
    assert param in err.message or "logit_bias" in err.message or "response_format" in err.message


def test_limits_are_stated_in_the_message() -> None:
    with pytest.raises(EngineError) as caught:
        parse_sampling({"temperature": 3}, chat=True, n_vocab=10)
    assert "between 0 and 2" in caught.value.message


def test_defaults_and_accepted_values() -> None:
    params = parse_sampling({}, chat=True, n_vocab=10)
    assert (params.temperature, params.top_p, params.n, params.max_tokens) == (1.0, 1.0, 1, None)
    params = parse_sampling(
        {
            "temperature": 0,
            "stop": "x",
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "logit_bias": {"3": -100},
        },
        chat=True,
        n_vocab=10,
    )
    assert params.temperature == 0.0
    assert params.stop == ["x"]
    assert params.max_tokens == 7  # max_completion_tokens wins in chat
    assert params.logit_bias == {3: -100.0}


def test_legacy_completions_logprobs_is_a_count() -> None:
    params = parse_sampling({"logprobs": 3}, chat=False, n_vocab=10)
    assert params.logprobs and params.top_logprobs == 3
    with pytest.raises(EngineError) as caught:
        parse_sampling({"logprobs": 6}, chat=False, n_vocab=10)
    assert caught.value.param == "logprobs"


def test_seeded_choices_differ_from_each_other_but_repeat() -> None:
    params = parse_sampling({"seed": 42}, chat=True, n_vocab=10)
    assert params.choice_seed(0) == params.choice_seed(0)
    assert params.choice_seed(0) != params.choice_seed(1)


def test_json_schema_becomes_a_grammar(allows: Callable[[str, str], bool]) -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    params = parse_sampling(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": schema},
            }
        },
        chat=True,
        n_vocab=10,
    )
    assert params.grammar is not None
    assert allows(params.grammar, '{"age": 41}')
    assert not allows(params.grammar, '{"age": "41"}') and not allows(params.grammar, "41")


def test_number_bounds_are_held_and_unsupported_keywords_refused_when_strict(
    allows: Callable[[str, str], bool],
) -> None:
    stars = {"type": "integer", "minimum": 1, "maximum": 5}
    schema = {"type": "object", "properties": {"stars": stars}, "required": ["stars"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}}
    grammar = parse_sampling({"response_format": fmt}, chat=True, n_vocab=10).grammar
    assert grammar is not None
    assert allows(grammar, '{"stars": 5}')
    assert not allows(grammar, '{"stars": 7}') and not allows(grammar, '{"stars": 10}')
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    fmt["json_schema"]["schema"] = {"type": "object", "properties": {"ids": unique}}
    with pytest.raises(EngineError) as caught:
        parse_sampling({"response_format": fmt}, chat=True, n_vocab=10)
    assert caught.value.status_code == 400 and caught.value.param == "response_format"
    assert "uniqueItems" in caught.value.message
    # Not strict: OpenAI's best effort; what cannot be held is left out, the rest is held.
    fmt["json_schema"]["strict"] = False
    loose = parse_sampling({"response_format": fmt}, chat=True, n_vocab=10).grammar
    assert loose is not None and allows(loose, '{"ids": [1, 1]}')
    assert not allows(loose, '{"ids": ["a"]}')
