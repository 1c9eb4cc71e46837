"""OpenAI sampling parameters -> validated per-request settings (jobs.SamplingParams); the
llama.cpp sampler chain they configure is built in engine/llama/binding/sampler.py, and the grammar
of `response_format` in engine/structured.py.

Validation happens once per request, before it is queued, so a bad parameter fails that
request alone with an OpenAI-shaped 400 that names the parameter and its limit.
"""

from __future__ import annotations

import math
from typing import Any

from app.engine import structured
from app.engine.base import EngineError
from app.engine.llama.jobs.jobs import Sampling
from app.errors import invalid

MAX_STOP_SEQUENCES = 4
MAX_N = 128
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions endpoint caps `logprobs` at 5


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(
            f"'{name}' must be a number between {lo:g} and {hi:g}.",
            param=name,
            code="invalid_type",
            cls=EngineError,
        )
    if not lo <= value <= hi:
        raise invalid(
            f"{value!r} is out of range for '{name}': it must be between {lo:g} and {hi:g}.",
            param=name,
            cls=EngineError,
        )
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(
            f"'{name}' must be an integer.", param=name, code="invalid_type", cls=EngineError
        )
    if value < lo or (hi is not None and value > hi):
        limit = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise invalid(
            f"{value!r} is out of range for '{name}': it must be {limit}.",
            param=name,
            cls=EngineError,
        )
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid(
            "'stop' must be a string or a list of strings.",
            param="stop",
            code="invalid_type",
            cls=EngineError,
        )
    if len(stop) > MAX_STOP_SEQUENCES:
        raise invalid(
            f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences, got {len(stop)}.",
            param="stop",
            cls=EngineError,
        )
    return [s for s in stop if s]


def _logit_bias(body: dict[str, Any], n_vocab: int) -> dict[int, float]:
    raw = body.get("logit_bias")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid(
            "'logit_bias' must be an object of token id -> bias.",
            param="logit_bias",
            code="invalid_type",
            cls=EngineError,
        )
    bias: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise invalid(
                f"logit_bias key {key!r} is not a token id.", param="logit_bias", cls=EngineError
            ) from None
        if not 0 <= token < n_vocab:
            raise invalid(
                f"logit_bias token id {token} is outside the vocabulary (0..{n_vocab - 1}).",
                param="logit_bias",
                cls=EngineError,
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not -100 <= value <= 100
        ):
            raise invalid(
                f"logit_bias value for token {token} must be between -100 and 100.",
                param="logit_bias",
                cls=EngineError,
            )
        bias[token] = float(value)
    return bias


def _response_format(body: dict[str, Any]) -> str | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or "type" not in fmt:
        raise invalid(
            "'response_format' must be an object with a 'type'.",
            param="response_format",
            code="invalid_type",
            cls=EngineError,
        )
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return structured.json_object_grammar()
    if kind == "json_schema":
        return structured.json_schema_grammar(fmt.get("json_schema"))
    raise invalid(
        f"response_format type {kind!r} is not supported; use text, json_object or json_schema.",
        param="response_format",
        cls=EngineError,
    )


def parse_sampling(body: dict[str, Any], *, chat: bool, n_vocab: int) -> Sampling:
    """Read and check every sampling field of a chat or completions body."""
    params = Sampling(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        stop=_stop(body),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body, n_vocab),
        grammar=_response_format(body),
    )
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise invalid(
                "'seed' must be an integer.", param="seed", code="invalid_type", cls=EngineError
            )
        params.seed = seed
    # max_completion_tokens is the chat name that replaced max_tokens; it wins when both are set.
    name = (
        "max_completion_tokens"
        if chat and body.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    params.max_tokens = _integer(body, name, 1)
    params.n = _integer(body, "n", 1, MAX_N) or 1
    if chat:
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise invalid(
                "'logprobs' must be true or false.",
                param="logprobs",
                code="invalid_type",
                cls=EngineError,
            )
        params.logprobs = bool(logprobs)
        top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top is not None and not params.logprobs:
            raise invalid(
                "'top_logprobs' needs 'logprobs' set to true.",
                param="top_logprobs",
                cls=EngineError,
            )
        params.top_logprobs = top or 0
    else:
        # The legacy endpoint's `logprobs` is the number of alternatives per token.
        top = _integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
        params.logprobs = top is not None
        params.top_logprobs = top or 0
    return params
