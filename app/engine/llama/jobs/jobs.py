"""Per-request state of the embedded engine, without llama.cpp: a `Job` is one submitted
request, its prompts become `Task`s on the scheduler's queue, and each output sequence is a
`Choice`. The parsed request parts a job carries live here too (`Sampling`, the tool
`ToolUse`, the Responses `ResponseRequest`), so oai/ fills them and slots.py reads them
without importing each other (llama.cpp's server_task and its task_params).
"""

from __future__ import annotations

import secrets
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from app.engine.base import ChunkCallback, Priority
from app.engine.llama.jobs.block import Block
from app.engine.reasoning import BEFORE, Thought
from app.wire.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES

_ID_PREFIX = {CHAT: "chatcmpl-", COMPLETIONS: "cmpl-", EMBEDDINGS: "emb-", RESPONSES: "resp_"}


@dataclass
class Sampling:
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
    #: The answer's grammar (engine/structured.py: a JSON schema, json_object or a tool
    #: call, compiled by llguidance); None: free text.
    grammar: str | None = None

    @property
    def plain_greedy(self) -> bool:
        """Temperature 0 with nothing that reshapes the logits: the token is their argmax (a
        grammar's mask is already on them: grammars.py)."""
        return (
            self.temperature == 0.0
            and not self.logit_bias
            and not self.presence_penalty
            and not self.frequency_penalty
        )

    def choice_seed(self, index: int) -> int:
        """Each of the n choices gets its own stream; a fixed seed makes all of them repeatable."""
        if self.seed is None:
            return secrets.randbits(32)
        return (self.seed + index) & 0xFFFFFFFF


@dataclass
class Function:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False  # a keyword the grammar cannot hold is refused, not left out


@dataclass
class ToolUse:
    """What one request's tools ask of the engine."""

    functions: list[Function]
    choice: str = "auto"  # "auto" | "required" | "none"
    allowed: list[str] = field(default_factory=list)  # the names a call may use
    named: str | None = None  # tool_choice naming one function
    parallel: bool = True
    calls: dict[int, list[dict[str, Any]] | None] = field(default_factory=dict)  # by choice
    modes: dict[int, str] = field(default_factory=dict)  # streaming: "text" or "call", by choice

    @property
    def active(self) -> bool:
        """The model may call a function in this turn."""
        return self.choice != "none" and bool(self.allowed)


@dataclass
class ResponseRequest:
    """What the `response` object echoes of the request, and its stream's progress."""

    echo: dict[str, Any]
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])
    sequence: int = 0
    opened: bool = False  # response.created / in_progress went out
    mode: str | None = None  # "text" once the message item is open, "call" while held back
    completed_at: int | None = None
    #: The `reasoning` the request asked for ({effort, summary}), echoed; the reasoning
    #: item's id, its text streamed so far (None: none yet) and whether its item is closed.
    reasoning: dict[str, Any] = field(default_factory=lambda: {"effort": None, "summary": None})
    reasoning_id: str = field(default_factory=lambda: "rs_" + uuid.uuid4().hex[:24])
    thought: str | None = None
    thought_closed: bool = False

    @property
    def first(self) -> int:
        """The output index of the answer's first item: after the reasoning item, if any."""
        return 0 if self.thought is None else 1


@dataclass
class Choice:
    """One output sequence of a request."""

    index: int
    text: str = ""
    #: A thinking model's thought, apart from `text` (the answer), and its split.
    reasoning: str = ""
    thought: Thought | None = None
    completion_tokens: int = 0
    tokens: list[int] = field(default_factory=list)  # the answer's ids, sampled or forced
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    started: bool = False  # the streamed role chunk went out

    @property
    def reasoning_tokens(self) -> int:
        """The answer's tokens that belong to its thought (within completion_tokens)."""
        return self.thought.tokens if self.thought is not None else 0


class Job:
    """One submitted request and everything its response needs."""

    def __init__(
        self,
        endpoint: str,
        body: dict[str, Any],
        priority: Priority,
        on_chunk: ChunkCallback | None,
        model: str = "",
    ) -> None:
        self.endpoint = endpoint  # one of base.ENDPOINTS
        self.body = body
        #: The id its answer carries in `model`: the engine's own, or the catalog id the pool
        #: routed the request to (one model listed under two ids answers as either).
        self.model = model
        self.priority = priority
        self.on_chunk = on_chunk
        self.future: Future[dict[str, Any]] = Future()
        self.created = int(time.time())
        self.id = _ID_PREFIX[endpoint] + uuid.uuid4().hex[:24]
        self.params = Sampling()
        self.prompts: list[list[int]] = []  # token ids per prompt
        self.prompt_texts: list[str] = []
        self.choices: list[Choice] = []
        self.unfinished = 0
        self.cached_tokens = 0  # prompt tokens taken from KV already in the cache
        self.cancelled = False
        self.stop_strings: list[str] = []
        self.echo = False
        self.include_usage = False
        self.tools: ToolUse | None = None  # when the request has tools (oai/tools.py)
        #: A thinking model's answer (reasoning.py): the tokens a thought may take before
        #: the engine closes it (None: no bound), the tokens that close it, and whether
        #: the thought stays inline in the text (`reasoning_format: "none"`).
        self.thought_budget: int | None = None
        self.thought_close: list[int] = []
        self.thought_inline = False
        self.thought_start = BEFORE  # where each answer starts: reasoning.Thought.state
        self.thought_spent = 0  # budget tokens the prompt spent in a thought it opened
        self.response: ResponseRequest | None = None  # for RESPONSES (oai/responses_request.py)
        #: Images of the prompt (vision.py): the first id of each image chunk in the token
        #: list -> its key in the model's image store; the chunks prepare cut, until the
        #: store takes them; and the keys the job holds pinned there until it settles.
        self.images: dict[int, str] = {}
        self.image_chunks: list[Any] = []
        self.image_pins: list[str] = []


@dataclass(order=True)
class Task:
    """A unit of queued work: up to `slots` choices of one prompt, which share its evaluation."""

    priority: int
    seq_no: int
    job: Job = field(compare=False)
    prompt_index: int = field(compare=False, default=0)
    choice_indices: list[int] = field(compare=False, default_factory=list)
    #: The prompt's slots.chunk_keys, once the admission has looked at it.
    prefix_keys: list[int] | None = field(compare=False, default=None, repr=False)
    #: shared.py's best block for the prompt and the tokens a fork takes from it, with the
    #: version of the blocks it was found in.
    shared_match: tuple[int, Block | None, int] | None = field(
        compare=False, default=None, repr=False
    )
