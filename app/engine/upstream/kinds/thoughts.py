"""Thinking models behind an upstream: how each kind of server takes a request's reasoning
controls, and how a thought in its answer becomes batchyard's.

Requests. A body says what it asks of a thinking model as OpenAI and batchyard spell it:
`reasoning_effort` (chat), `reasoning: {effort}` (Responses), `chat_template_kwargs` and
`thinking_token_budget`. Each is checked by app/engine/reasoning.py's rules (`EFFORTS`,
`budget_of`, `request_controls`) before anything goes upstream, a bad one a 400 that names it,
and then written the way the upstream's kind takes it: the table WIRES, one row a kind. What
a server cannot take at all (a budget for Ollama or SGLang) is a 400 `unsupported_parameter`,
not dropped: the line would run without the bound it asked for.

Answers. Servers name a thought differently: `message.reasoning` (vLLM since late 2025,
Ollama, LM Studio for gpt-oss), `message.reasoning_content` (llama-server, SGLang, LM Studio),
or not at all, leaving `<think>...</think>` in the content (a server started without its
reasoning parser). Whatever the kind, `settle` makes each of them batchyard's
`reasoning_content` (`delta.reasoning_content` in a stream, `StreamThoughts`), and a
Responses answer keeps its `reasoning` items as the server wrote them. A reasoning-token
count the server gave is kept; where it gave a thought but no count (llama-server, Ollama's
chat) or a 0 (Ollama's Responses), the count is null: not known, rather than a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.base import EngineError
from app.engine.reasoning import (
    ANSWER,
    INLINE,
    SWITCH,
    Thought,
    request_controls,
    responses_effort,
    split,
)
from app.errors import invalid
from app.wire.endpoints import CHAT, RESPONSES


@dataclass(frozen=True)
class ReasoningWire:
    """How one kind of server takes a request's reasoning controls."""

    server: str  # its name, in errors
    #: Chat's `reasoning_effort` goes as it is; else into `chat_template_kwargs`, as a chat
    #: template reads it (`enable_thinking: false` for "none", `reasoning_effort` otherwise).
    effort: bool = True
    #: It takes `chat_template_kwargs`; else only `enable_thinking`, sent as the effort
    #: ("none" for false), and any other variable is a 400.
    template_kwargs: bool = True
    #: The field a thinking budget goes in; None: it takes none (a budget is a 400).
    budget: str | None = "thinking_token_budget"
    #: What that field says for "no budget" (-1 as the request writes it); None: it is left
    #: out (vLLM: no budget unless one is given).
    unbounded: int | None = -1
    #: Its Responses endpoint reads the effort from `reasoning_effort` (llama-server runs
    #: Responses on its chat path and leaves `reasoning` unread): sent there too.
    responses_effort: bool = False
    #: Fields every chat request to it carries.
    chat_fields: tuple[tuple[str, Any], ...] = ()


#: Each kind (app/config/upstreams.py: KINDS) and how its server takes reasoning controls
#: (docs/upstreams.md has this table for users). Sources: vLLM's chat and Responses
#: protocols (`reasoning_effort`, `chat_template_kwargs`, `thinking_token_budget`),
#: llama-server's README (`reasoning_effort`, `chat_template_kwargs`, the per-request
#: `reasoning_budget_tokens`), Ollama's OpenAI layer (openai/openai.go: `reasoning_effort`,
#: `reasoning.effort`; no template variables, no budget) and SGLang's reasoning parser docs
#: (`chat_template_kwargs`, `separate_reasoning`).
WIRES: dict[str, ReasoningWire] = {
    "openai": ReasoningWire("an OpenAI-compatible server"),  # each as written
    "batchyard": ReasoningWire("batchyard"),
    "vllm": ReasoningWire("vLLM", unbounded=None),
    "llama-server": ReasoningWire(
        "llama-server", budget="reasoning_budget_tokens", responses_effort=True
    ),
    "sglang": ReasoningWire(
        "SGLang", effort=False, budget=None, chat_fields=(("separate_reasoning", True),)
    ),
    "ollama": ReasoningWire("Ollama", template_kwargs=False, budget=None),
}

#: The fields of a body that say something to a thinking model.
CONTROLS = ("reasoning_effort", "reasoning", "chat_template_kwargs", "thinking_token_budget")


def outgoing(wire: ReasoningWire, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its reasoning controls checked and written as `wire`'s server takes them
    (a new dict where anything changes; `body` itself is left as it is)."""
    if endpoint not in (CHAT, RESPONSES):
        return body
    fields = wire.chat_fields if endpoint == CHAT else ()
    if not fields and not any(key in body for key in CONTROLS):
        return body  # most lines: nothing to check or write
    controls = request_controls(body)  # the effort, the budget, the template's variables
    out = {**body, **dict(fields)}
    effort = controls.effort
    if endpoint == RESPONSES:
        effort = responses_effort(body.get("reasoning"))
        if wire.responses_effort and effort is not None:
            out.setdefault("reasoning_effort", effort)
    elif not wire.effort:
        out.pop("reasoning_effort", None)
        if controls.template_kwargs:
            out["chat_template_kwargs"] = controls.template_kwargs
    if not wire.template_kwargs and "chat_template_kwargs" in body:
        _switch_as_effort(wire, endpoint, out, effort)
    if body.get("thinking_token_budget") is not None:
        _budget(wire, out, controls.budget)
    return out


def _budget(wire: ReasoningWire, out: dict[str, Any], budget: int | None) -> None:
    """A request's thinking budget (checked: None is -1, no budget) in `wire`'s field."""
    del out["thinking_token_budget"]
    if wire.budget is None:
        if budget is not None:
            raise _unsupported(wire, "thinking_token_budget", "thinking budget")
        return
    value = budget if budget is not None else wire.unbounded
    if value is not None:
        out[wire.budget] = value


def _switch_as_effort(
    wire: ReasoningWire, endpoint: str, out: dict[str, Any], effort: str | None
) -> None:
    """`chat_template_kwargs` to a server that takes none (Ollama): its `enable_thinking`
    becomes the effort ("none" for false; the template's variables win over an effort, as
    `request_controls` has it), and any other variable is a 400."""
    kwargs = out.pop("chat_template_kwargs") or {}
    if set(kwargs) - {SWITCH}:
        raise _unsupported(
            wire,
            "chat_template_kwargs",
            f"chat template variables other than {SWITCH} (use reasoning_effort)",
        )
    switch = kwargs.get(SWITCH)
    if switch is None or (switch and effort != "none"):
        return
    chosen = "none" if switch is False else None
    if endpoint == RESPONSES:
        reasoning = {**(out.get("reasoning") or {}), "effort": chosen}
        out["reasoning"] = {k: v for k, v in reasoning.items() if v is not None}
    elif chosen is None:
        out.pop("reasoning_effort", None)
    else:
        out["reasoning_effort"] = chosen


def _unsupported(wire: ReasoningWire, param: str, what: str) -> EngineError:
    return invalid(
        f"'{param}' cannot be sent to this model: its upstream, {wire.server}, takes no {what}.",
        param=param,
        code="unsupported_parameter",
        cls=EngineError,
    )


# ---------------------------------------------------------------------------------- answers


def renamed(part: dict[str, Any]) -> bool:
    """A `message` or `delta` with a thought named `reasoning` (vLLM's, Ollama's name) as
    `reasoning_content` (in place); whether it has a thought so named, by either name."""
    other = part.pop("reasoning", None)
    if isinstance(other, str) and not part.get("reasoning_content"):
        part["reasoning_content"] = other
    return bool(part.get("reasoning_content"))


def settle(part: dict[str, Any]) -> bool:
    """A chat answer's `message` with its thought, however the server wrote it, as
    `reasoning_content` (in place); whether it has one. A thought left inline
    (`<think>...</think>` opening the content) is split out of the content."""
    if renamed(part):
        return True
    content = part.get("content")
    if isinstance(content, str) and INLINE.start in content:
        thought, answer = split(content, INLINE)
        if thought:
            part["reasoning_content"], part["content"] = thought, answer
            return True
    return False


def unknown_count(usage: Any, details: str) -> None:
    """The `usage` of an answer that has a thought: a reasoning-token count that is missing
    (or 0, which a thought cannot take) becomes null in `details`: not known."""
    if not isinstance(usage, dict):
        return
    counts = usage.get(details)
    if not isinstance(counts, dict):
        counts = usage[details] = {}
    if not counts.get("reasoning_tokens"):
        counts["reasoning_tokens"] = None


def _has_thought(item: Any) -> bool:
    """A Responses output item that is a reasoning item with some text."""
    if not isinstance(item, dict) or item.get("type") != "reasoning":
        return False
    parts = [*(item.get("content") or ()), *(item.get("summary") or ())]
    return any(isinstance(p, dict) and p.get("text") for p in parts)


def incoming(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """A whole answer from the upstream as batchyard's (in place): each chat message's
    thought as `reasoning_content`; a Responses answer's reasoning items as they are. Either
    way, a count the server left out beside a thought is null (`unknown_count`)."""
    if endpoint == CHAT:
        thought = False
        for choice in body.get("choices") or ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                thought = settle(message) or thought
        if thought:
            unknown_count(body.get("usage"), "completion_tokens_details")
    elif endpoint == RESPONSES and any(_has_thought(i) for i in body.get("output") or ()):
        unknown_count(body.get("usage"), "output_tokens_details")
    return body


class StreamThoughts:
    """One chat stream's thoughts as batchyard's, chunk by chunk (in place): a delta's
    `reasoning` as `reasoning_content`, and a thought left inline in the content split out
    as it streams (a tag cut across chunks is held back until it is whole)."""

    def __init__(self) -> None:
        #: Per choice: the split of its content while a thought may still open or is open;
        #: None once its content is known to be answer alone (passed on as it comes).
        self._splits: dict[int, Thought | None] = {}
        self.thought = False

    def chunk(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = choice["delta"] = {}
            self._delta(int(choice.get("index") or 0), delta, bool(choice.get("finish_reason")))
        if self.thought:
            unknown_count(chunk.get("usage"), "completion_tokens_details")

    def _delta(self, index: int, delta: dict[str, Any], last: bool) -> None:
        if renamed(delta):
            self.thought = True
            self._splits[index] = None  # the server splits: its content is the answer
            return
        split_ = self._splits.setdefault(index, Thought(INLINE))
        if split_ is None:
            return
        content = delta.get("content")
        thought, answer = split_.feed(content) if isinstance(content, str) else ("", "")
        if last:
            rest_thought, rest_answer = split_.finish()
            thought, answer = thought + rest_thought, answer + rest_answer
        if isinstance(content, str) or answer:
            delta["content"] = answer
        if thought:
            delta["reasoning_content"] = thought
            self.thought = True
        if split_.state == ANSWER or last:
            self._splits[index] = None


__all__ = [
    "CONTROLS",
    "WIRES",
    "ReasoningWire",
    "StreamThoughts",
    "incoming",
    "outgoing",
    "renamed",
    "settle",
    "unknown_count",
]
