"""OpenAI sampling parameters -> validated per-request settings and a llama.cpp sampler chain.

Validation happens once per request, before it is queued, so a bad parameter fails that
request alone with an OpenAI-shaped 400 that names the parameter and its limit.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from app.engine.base import EngineError
from app.errors import invalid

MAX_STOP_SEQUENCES = 4
MAX_N = 128
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions endpoint caps `logprobs` at 5

# The JSON grammar of llama.cpp (grammars/json.gbnf): any JSON object at the top level.
JSON_OBJECT_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
"""


@dataclass
class SamplingParams:
    """One request's decoding settings, already checked against OpenAI's limits."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    max_tokens: int | None = None  # None: the rest of the slot's context
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None  # GBNF text for response_format

    @property
    def plain_greedy(self) -> bool:
        """Temperature 0 with nothing that reshapes the logits: the token is their argmax."""
        return (
            self.temperature == 0.0
            and not self.logit_bias
            and not self.presence_penalty
            and not self.frequency_penalty
            and self.grammar is None
        )

    def choice_seed(self, index: int) -> int:
        """Each of the n choices gets its own stream; a fixed seed makes all of them repeatable."""
        if self.seed is None:
            return secrets.randbits(32)
        return (self.seed + index) & 0xFFFFFFFF


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
        return JSON_OBJECT_GBNF
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise invalid(
                "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}.",
                param="response_format",
                cls=EngineError,
            )
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        try:
            return json_schema_to_gbnf(json.dumps(schema))
        except Exception as exc:  # the converter raises plain errors on schemas it cannot express
            raise invalid(
                f"The JSON schema cannot be turned into a grammar: {exc}",
                param="response_format",
                cls=EngineError,
            ) from None
    raise invalid(
        f"response_format type {kind!r} is not supported; use text, json_object or json_schema.",
        param="response_format",
        cls=EngineError,
    )


def parse_sampling(body: dict[str, Any], *, chat: bool, n_vocab: int) -> SamplingParams:
    """Read and check every sampling field of a chat or completions body."""
    params = SamplingParams(
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


def build_sampler(
    params: SamplingParams, vocab: Any, n_vocab: int, seed: int, penalty_window: int
) -> Any:
    """A sampler chain for one sequence: bias, penalties, grammar, then greedy or temp/top_p/dist."""
    import llama_cpp as lc

    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if params.logit_bias:
        items = (lc.llama_logit_bias * len(params.logit_bias))()
        for i, (token, bias) in enumerate(params.logit_bias.items()):
            items[i].token = token
            # OpenAI's +-100 means "always" / "never"; a large finite bias does that reliably.
            items[i].bias = bias
        lc.llama_sampler_chain_add(
            chain, lc.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), items)
        )
    if params.presence_penalty or params.frequency_penalty:
        lc.llama_sampler_chain_add(
            chain,
            lc.llama_sampler_init_penalties(
                penalty_window, 1.0, params.frequency_penalty, params.presence_penalty
            ),
        )
    if params.grammar:
        grammar = lc.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
        if not grammar:
            lc.llama_sampler_free(chain)
            raise invalid(
                "llama.cpp could not parse the grammar for response_format.",
                param="response_format",
                cls=EngineError,
            )
        lc.llama_sampler_chain_add(chain, grammar)
    if params.temperature == 0.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    else:
        # OpenAI applies the temperature first, then the nucleus cut on the scaled distribution.
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
        if params.top_p < 1.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    return chain


def free_sampler(chain: Any) -> None:
    import llama_cpp as lc

    if chain:
        lc.llama_sampler_free(chain)


class StopMatcher:
    """Finds stop strings across token boundaries and holds back text that may start one.

    `feed` takes newly decoded text and returns the text that is safe to emit now;
    `stopped` turns true once a stop string appears, and nothing from it on is emitted.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""
        self.stopped = False
        self._longest = max((len(s) for s in stops), default=0)

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = self._held_back(self.pending)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return out

    def flush(self) -> str:
        """At the end of generation a held-back prefix that never became a stop is real text."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _held_back(self, text: str) -> int:
        for size in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) for s in self.stops):
                return size
        return 0


def top_logprobs_of(logits: Any, n_vocab: int, k: int) -> tuple[Any, list[int]]:
    """Log-softmax of one row of logits and the ids of its k most likely tokens."""
    import numpy as np

    row = np.ctypeslib.as_array(logits, shape=(n_vocab,)).astype(np.float64)
    row = row - row.max()
    logp = row - math.log(float(np.exp(row).sum()))
    top = [] if k <= 0 else [int(t) for t in np.argsort(-logp)[:k]]
    return logp, top
