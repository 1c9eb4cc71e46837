"""Thinking models: a thought apart from the answer.

Pure (no model, no llama_cpp), so the embedded engine, the upstream engine and the batch
checks share one reading of each rule:

- `EFFORTS`: the efforts OpenAI's SDK types allow (`reasoning_effort` on chat, Responses'
  `reasoning.effort`); `request_controls` reads a body's effort, budget, `reasoning_format`
  and `chat_template_kwargs` and says what the chat template is given.
- `ThinkingFormat`: how a model writes its thought, found in its chat template (`detect`),
  as llama.cpp's common/chat reads it: `<think>...</think>` (Qwen3, SmolLM3, DeepSeek-R1,
  whose template opens the thought in the prompt), Magistral's `[THINK]...[/THINK]`, and
  gpt-oss's channels (analysis is the thought, final the answer).
- `present`: a chat answer or chunk as it leaves batchyard, its thought under the name
  `--reasoning-field` gives (engines write `reasoning_content`).
- `Thought`: the streaming split of a model's output into thought and answer, token by
  token, counting the tokens of the thought exactly (no re-tokenising); `split` is the same
  over a whole text (an upstream's answer with its thinking left inline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.config import REASONING_FIELDS
from app.engine.base import EngineError
from app.errors import invalid

#: OpenAI's ReasoningEffort (the `openai` SDK's type of that name), in order.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
#: Where an answer's thought goes (`--reasoning-field`, checked with the other settings):
#: llama-server, LM Studio and SGLang name it `reasoning_content`, vLLM and Ollama `reasoning`.
FIELDS = REASONING_FIELDS
#: `reasoning_format` on a request, as llama-server takes it: "none" keeps the thought
#: inline in the content; the others put it apart.
FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
#: The template variable that turns thinking on or off (Qwen3, SmolLM3, GLM, ...).
SWITCH = "enable_thinking"


@dataclass(frozen=True)
class ThinkingFormat:
    """How one model writes a thought."""

    start: str  # the tag that opens a thought
    end: str  # the tag that closes it
    #: Text between the closing tag and the answer, dropped (gpt-oss's final channel header).
    openers: tuple[str, ...] = ()
    #: The template opens the thought itself: the output starts inside it (DeepSeek-R1).
    opened: bool = False
    #: The template reads `enable_thinking`: `reasoning_effort: "none"` turns thinking off.
    switch: bool = False
    #: The template reads `reasoning_effort` (gpt-oss's says "Reasoning: low" to the model).
    reads_effort: bool = False
    name: str = "think"


#: The families, by the tags their templates spell: (name, start, end, answer openers).
_FAMILIES = (
    (
        "channels",
        "<|channel|>analysis<|message|>",
        "<|end|>",
        ("<|start|>assistant<|channel|>final<|message|>", "<|channel|>final<|message|>"),
    ),
    ("think_brackets", "[THINK]", "[/THINK]", ()),
    ("think", "<think>", "</think>", ()),
)


def detect(source: str | None, generation_prompt: str = "") -> ThinkingFormat | None:
    """The thinking format of a chat template (its Jinja source), or None: the model does not
    reason. `generation_prompt` is what the template renders for a one-user-message
    conversation: ending with the opening tag, the template opens each thought itself."""
    if not source:
        return None
    for name, start, end, openers in _FAMILIES:
        # A template that opens the thought may never spell its closing tag.
        marker = "<|channel|>" if name == "channels" else start
        if marker in source:
            return ThinkingFormat(
                start=start,
                end=end,
                openers=openers,
                opened=generation_prompt.rstrip().endswith(start.rstrip()),
                switch=SWITCH in source,
                reads_effort="reasoning_effort" in source,
                name=name,
            )
    return None


@dataclass
class Controls:
    """What a request asks of a thinking model."""

    effort: str | None = None
    #: Tokens a thought may take before the engine closes it (None: no bound).
    budget: int | None = None
    #: Keep the thought inline in the content (`reasoning_format: "none"`).
    inline: bool = False
    #: Variables for the chat template (`enable_thinking`, `reasoning_effort` and the
    #: request's own `chat_template_kwargs`).
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def effort_of(value: Any, param: str) -> str | None:
    """An effort (`reasoning_effort`, or Responses' `reasoning.effort` as `param` names it),
    checked against EFFORTS; None when none is given."""
    if value is None:
        return None
    if value not in EFFORTS:
        raise invalid(
            f"Invalid value for '{param}': {value!r}. Supported values are: "
            + ", ".join(repr(e) for e in EFFORTS)
            + ".",
            param=param,
            cls=EngineError,
        )
    return str(value)


def responses_effort(reasoning: Any) -> str | None:
    """The effort of Responses' `reasoning` object, checked."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise invalid(
            '\'reasoning\' must be an object, as {"effort": "low"}.',
            param="reasoning",
            code="invalid_type",
            cls=EngineError,
        )
    return effort_of(reasoning.get("effort"), "reasoning.effort")


def budget_of(value: Any, param: str) -> int | None:
    """A thinking budget in tokens (-1 or None: unbounded), checked."""
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(
            f"'{param}' must be a whole number of tokens, 0 or more (-1: no budget); "
            f"got {value!r}.",
            param=param,
            cls=EngineError,
        )
    return int(value)


def request_controls(body: dict[str, Any], default_budget: int | None = None) -> Controls:
    """The reasoning controls of a chat body (a Responses body's `reasoning.effort` arrives
    here as `reasoning_effort`): the effort, the budget (`thinking_token_budget`, as vLLM
    names it; else the server's `--reasoning-budget`), `reasoning_format` and the template's
    variables. "none" turns thinking off where the template has a switch; any other effort
    reaches the template as `reasoning_effort`. The request's own `chat_template_kwargs` win."""
    effort = effort_of(body.get("reasoning_effort"), "reasoning_effort")
    budget = budget_of(body.get("thinking_token_budget"), "thinking_token_budget")
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in FORMATS:
        raise invalid(
            f"'reasoning_format' must be one of {', '.join(FORMATS)}; got {fmt!r}.",
            param="reasoning_format",
            cls=EngineError,
        )
    extra = body.get("chat_template_kwargs")
    if extra is not None and not isinstance(extra, dict):
        raise invalid(
            "'chat_template_kwargs' must be an object.",
            param="chat_template_kwargs",
            code="invalid_type",
            cls=EngineError,
        )
    kwargs: dict[str, Any] = {}
    if effort == "none":
        kwargs[SWITCH] = False
    elif effort is not None:
        kwargs["reasoning_effort"] = effort
    kwargs.update(extra or {})
    if SWITCH in kwargs and not isinstance(kwargs[SWITCH], bool):
        raise invalid(
            f"chat_template_kwargs.{SWITCH} must be true or false.",
            param=f"chat_template_kwargs.{SWITCH}",
            code="invalid_type",
            cls=EngineError,
        )
    return Controls(
        effort=effort,
        budget=budget if budget is not None else default_budget,
        inline=fmt == "none",
        template_kwargs=kwargs,
    )


def body_error(body: Any) -> EngineError | None:
    """Why a body's reasoning controls are refused (chat's, or Responses'
    `reasoning.effort`), or None: what a batch line is checked for up front."""
    if not isinstance(body, dict):
        return None
    try:
        responses_effort(body.get("reasoning"))
        request_controls(body)
    except EngineError as exc:
        return exc
    return None


#: Where a split stands.
BEFORE, THINKING, CLOSING, ANSWER = "before", "thinking", "closing", "answer"


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag` (kept back a step)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class Thought:
    """One answer's split into its thought and the answer proper, fed text a token at a time.

    `feed` takes one token's text and returns (thought text, answer text) that it adds;
    `tokens` counts the tokens of the thought: every token from the one that opens it
    through the one that closes it (and the answer's header, for gpt-oss), so
    `completion_tokens` is the thought's tokens plus the answer's.
    """

    def __init__(self, fmt: ThinkingFormat, state: str = BEFORE) -> None:
        self.fmt = fmt
        self.state = state
        self.entered = state == THINKING
        self.tokens = 0  # of the thought
        #: Tokens fed inside the open thought (its opening tag not counted): what a thinking
        #: budget bounds, as llama.cpp's reasoning budget counts.
        self.inside = 0
        self._buffer = ""
        self._undecided = 0  # tokens fed while it was not yet known whether a thought opens
        self._said = False  # some of the thought's text went out

    @classmethod
    def for_prompt(cls, fmt: ThinkingFormat, prompt: str) -> Thought:
        """The split of an answer to `prompt`: inside a thought when the prompt opened one,
        past it when the prompt closed it (thinking turned off), else the model decides."""
        tail = prompt.rstrip()
        if tail.endswith(fmt.start.rstrip()):
            return cls(fmt, THINKING)
        if tail.endswith(fmt.end.rstrip()):
            return cls(fmt, ANSWER)
        return cls(fmt)

    @property
    def thinking(self) -> bool:
        """The thought is open: its next token is part of it."""
        return self.state == THINKING

    def feed(self, text: str) -> tuple[str, str]:
        before = self.state
        thought, answer = self._step(text)
        if before == BEFORE:
            if self.state == BEFORE:
                self._undecided += 1
            elif self.entered:
                self.tokens += self._undecided + 1
            self._undecided = 0 if self.state != BEFORE else self._undecided
        elif before == THINKING or (before == CLOSING and not answer):
            # The token that begins the answer after a closed thought is the answer's.
            self.tokens += 1
            self.inside += self.state == THINKING
        return thought, answer

    def _step(self, text: str) -> tuple[str, str]:
        if self.state == ANSWER:
            return "", text
        self._buffer += text
        thought = answer = ""
        if self.state == BEFORE:
            self._open()
        if self.state == THINKING:
            thought = self._think()
        if self.state == CLOSING:
            self._close()
        if self.state == ANSWER:
            answer, self._buffer = self._buffer, ""
        return thought, answer

    def _open(self) -> None:
        head = self._buffer.lstrip()
        start = self.fmt.start
        if head.startswith(start):
            self._buffer, self.state, self.entered = head[len(start) :], THINKING, True
            return
        for opener in self.fmt.openers:
            if head.startswith(opener):
                self._buffer, self.state = head[len(opener) :], ANSWER
                return
        if not any(tag.startswith(head) for tag in (start, *self.fmt.openers)):
            self.state = ANSWER

    def _think(self) -> str:
        """The thought's text that is sure: white space at its ends is left out (as
        llama.cpp's parser trims it), so what streams is what the answer holds."""
        if not self._said:
            self._buffer = self._buffer.lstrip()
        end = self.fmt.end
        at = self._buffer.find(end)
        if at >= 0:
            thought, self._buffer = self._buffer[:at].rstrip(), self._buffer[at + len(end) :]
            self.state = CLOSING
            return thought
        keep = _held(self._buffer, end)
        sure = self._buffer[: len(self._buffer) - keep].rstrip()
        self._buffer = self._buffer[len(sure) :]
        self._said = self._said or bool(sure)
        return sure

    def _close(self) -> None:
        head = self._buffer.lstrip()
        for opener in self.fmt.openers:
            if head.startswith(opener):
                self._buffer, self.state = head[len(opener) :].lstrip(), ANSWER
                return
            if opener.startswith(head):
                return  # could still be the answer's header
        if head:
            self._buffer, self.state = head, ANSWER

    def finish(self, text: str = "") -> tuple[str, str]:
        """The last `text` (no token of its own: what a decoder held back) and what the split
        held back, when the output ends: a thought cut off stays a thought."""
        thought, answer = self._step(text)
        rest, self._buffer = self._buffer, ""
        if self.state == THINKING:
            return thought + rest.rstrip(), answer
        if self.state == BEFORE:
            return thought, answer + rest
        return thought, answer + (rest.lstrip() if self.state == CLOSING else rest)


def split(text: str, fmt: ThinkingFormat, *, opened: bool = False) -> tuple[str, str]:
    """A whole answer's (thought, answer); `opened`: the text starts inside the thought."""
    thought = Thought(fmt, THINKING if opened else BEFORE)
    a, b = thought.feed(text)
    c, d = thought.finish()
    return a + c, b + d


#: The tags upstreams leave inline most often (their own parser off): `<think>` models.
INLINE = ThinkingFormat(start="<think>", end="</think>")


def present(body: dict[str, Any], field: str) -> dict[str, Any]:
    """A chat answer (`chat.completion`) or stream chunk as it leaves batchyard: the thought
    that engines write as `reasoning_content` goes under `field` (one of FIELDS: `reasoning`
    for clients written for vLLM or Ollama, `both`), changed in place. Any other body (a
    Responses answer or event, a completion, an error) is returned as it is."""
    if field == FIELDS[0]:
        return body
    for choice in body.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        part = choice.get("message") or choice.get("delta")
        if isinstance(part, dict) and "reasoning_content" in part:
            thought = (
                part["reasoning_content"] if field == "both" else part.pop("reasoning_content")
            )
            part["reasoning"] = thought
    return body
