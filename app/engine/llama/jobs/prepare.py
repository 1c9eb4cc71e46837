"""An OpenAI request body -> validated, templated, tokenized tasks for the engine's queue.

This runs in the submitting thread, before anything is queued (llama.cpp server's
params_from_json_cmpl): a bad parameter fails that request alone with an OpenAI-shaped 400
that names it, and the owner thread only ever sees ready work.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from app.engine import reasoning, structured
from app.engine.base import EngineError
from app.engine.llama.jobs.jobs import Choice, Job, Task, ToolUse
from app.engine.llama.jobs.oai import responses_request, tools
from app.engine.llama.jobs.oai.media import Media, bad_image
from app.engine.llama.jobs.oai.sampling import parse_sampling
from app.engine.tiers import service_tier
from app.errors import invalid
from app.wire.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES


class Tokenizer(Protocol):
    """What preparing needs of a vocabulary (native.py's Vocab)."""

    n_vocab: int
    bos: int

    def tokenize(
        self, text: str, *, add_special: bool, parse_special: bool = True
    ) -> list[int]: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...


class Template(Protocol):
    """What preparing needs of a chat template (oai/chat_template.py's ChatTemplate)."""

    thinking: reasoning.ThinkingFormat | None

    def render(
        self,
        messages: Any,
        plan: ToolUse | None = None,
        media: Media | None = None,
        model: str = "",
        kwargs: dict[str, Any] | None = None,
    ) -> str: ...

    def stop_strings(self) -> list[str]: ...


class Constraints(Protocol):
    """What preparing needs of the model's grammars (grammars.py's Grammars)."""

    def check(self, grammar: str) -> None: ...

    def tag(self, text: str) -> str | None: ...


class Vision(Protocol):
    """What preparing needs of a projector (vision.py's Projector)."""

    marker: str

    def tokenize(self, text: str, images: list[bytes]) -> tuple[list[int], list[Any]]: ...


def free_images(job: Job) -> None:
    """Free the image chunks prepare cut for a job that will not run."""
    for chunk in job.image_chunks:
        chunk.free()
    job.image_chunks = []


def is_token_list(x: Any) -> bool:
    """A non-empty list of token ids (ints, not bools), as `prompt` and `input` accept."""
    return (
        isinstance(x, list)
        and bool(x)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
    )


def _items(value: Any) -> list[Any] | None:
    """A string or a token list as one item, a non-empty list of them as itself; else None."""
    if isinstance(value, str) or is_token_list(value):
        return [value]
    if (
        isinstance(value, list)
        and value
        and all(isinstance(x, str) or is_token_list(x) for x in value)
    ):
        return value
    return None


class Preparer:
    """Turns bodies into tasks for one loaded model."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: Template,
        *,
        ctx_per_slot: int,
        n_slots: int,
        embedding_dim: int,
        vision: Vision | None = None,
        grammars: Constraints | None = None,
        thought_budget: int | None = None,
    ) -> None:
        self.vision = vision
        #: The server's thinking budget (`--reasoning-budget`), where a request names none.
        self.thought_budget = thought_budget
        self.grammars = grammars
        self.tokenizer = tokenizer
        self.template = template
        self.ctx_per_slot = ctx_per_slot
        self.n_slots = n_slots
        self.embedding_dim = embedding_dim
        #: A thinking model's tags, tokenized (the tokens that close a thought) and as the
        #: grammar names them (grammars.tag): the same for every request, found once each.
        self._tag_tokens: dict[str, list[int]] = {}
        self._tag_grammar: dict[str, structured.Tag] = {}

    def prepare(self, job: Job, seq: Iterator[int]) -> list[Task]:
        """Fill in `job` (params, prompts, choices) and return its tasks, numbered from `seq`."""
        body = job.body
        if not isinstance(body, dict):
            raise invalid(
                "The request body must be a JSON object.",
                param="body",
                code="invalid_type",
                cls=EngineError,
            )
        if job.endpoint == EMBEDDINGS:
            job.prompts = self._embedding_inputs(body)
            return [Task(int(job.priority), next(seq), job)]
        if job.endpoint == RESPONSES:
            # A Responses body runs as the chat body it translates to; the chat path's
            # errors are told back in the Responses names.
            body, job.response = responses_request.to_chat(body)
            try:
                return self._prepare_generation(job, body, seq)
            except EngineError as exc:
                free_images(job)
                raise responses_request.renamed(exc) from None
        try:
            return self._prepare_generation(job, body, seq)
        except EngineError:
            free_images(job)
            raise

    def _prepare_generation(self, job: Job, body: dict[str, Any], seq: Iterator[int]) -> list[Task]:
        chat = job.endpoint in (CHAT, RESPONSES)
        job.params = parse_sampling(body, chat=chat, n_vocab=self.tokenizer.n_vocab)
        stream_options = body.get("stream_options")
        job.include_usage = bool(
            isinstance(stream_options, dict) and stream_options.get("include_usage")
        )
        if chat:
            self._prepare_chat(job, body)
            param = "messages"
        else:
            if body.get("suffix"):
                raise invalid(
                    "'suffix' (fill-in-the-middle) is not supported by this server.",
                    param="suffix",
                    cls=EngineError,
                )
            job.echo = bool(body.get("echo"))
            if job.echo and job.params.logprobs:
                raise invalid(
                    "'echo' together with 'logprobs' is not supported (no prompt logprobs).",
                    param="echo",
                    cls=EngineError,
                )
            job.prompt_texts, job.prompts = self._completion_prompts(body.get("prompt"))
            job.stop_strings = job.params.stop
            param = "prompt"
        if job.params.grammar is not None and self.grammars is not None:
            # A matcher against the model's vocabulary, once, here: the grammar tokenizer is
            # built on the first (seconds for a large vocabulary) rather than in the loop
            # that decodes every sequence, and what the grammar cannot do is this job's 400.
            self.grammars.check(job.params.grammar)
        for tokens in job.prompts:
            self._check_fits(len(tokens), job.params.max_tokens, param)
        n = job.params.n
        job.choices = [Choice(i) for i in range(n * len(job.prompts))]
        fmt = self.template.thinking if job.endpoint != COMPLETIONS else None
        if fmt is not None:
            for choice in job.choices:
                choice.thought = reasoning.Thought(fmt, job.thought_start)
                choice.thought.inside = job.thought_spent
        job.unfinished = len(job.choices)
        tasks = []
        for p in range(len(job.prompts)):
            # A task never needs more slots than exist; bigger n is evaluated in groups.
            for start in range(0, n, self.n_slots):
                indices = [p * n + k for k in range(start, min(n, start + self.n_slots))]
                tasks.append(Task(int(job.priority), next(seq), job, p, indices))
        return tasks

    def _prepare_chat(self, job: Job, body: dict[str, Any]) -> None:
        """A chat body's tools, template (with its reasoning controls) and prompt."""
        # A batch line's tier is checked as the online endpoint checks it (it runs at
        # batch priority whatever it names).
        service_tier(body.get("service_tier"), cls=EngineError)
        plan = job.tools = tools.parse_tools(body)
        call_grammar = tools.grammar(plan)
        if plan is not None and call_grammar is not None:
            if job.params.grammar is not None and plan.choice == "auto":
                raise invalid(
                    "'response_format' together with tools that the model may call "
                    "('tool_choice' auto) is not supported; use tool_choice 'none' or "
                    "'required', or drop the response_format.",
                    param="response_format",
                    cls=EngineError,
                )
            job.params.grammar = call_grammar
        if job.tools is not None and job.tools.active and job.params.n > 1:
            raise invalid(
                "'n' above 1 together with tools is not supported.", param="n", cls=EngineError
            )
        controls = reasoning.request_controls(body, self.thought_budget)
        media = Media(self.vision.marker) if self.vision is not None else None
        text = self.template.render(
            body.get("messages"), job.tools, media, job.model, controls.template_kwargs
        )
        job.prompt_texts = [text]
        self._think(job, text, controls)
        if self.vision is not None and media is not None and media.images:
            job.prompts = [self._with_images(job, text, media.images)]
        else:
            job.prompts = [self.tokenizer.tokenize(text, add_special=False)]
        job.stop_strings = job.params.stop + self.template.stop_strings()

    def _think(self, job: Job, prompt: str, controls: reasoning.Controls) -> None:
        """A thinking model's answer: each choice's split (from where the prompt leaves the
        thought), its budget and the tokens that close a thought, and the grammar of a
        structured answer moved past the thought."""
        fmt = self.template.thinking
        if fmt is None:
            return
        job.thought_inline = controls.inline
        job.thought_budget = controls.budget
        close = fmt.end + (fmt.openers[0] if fmt.openers else "")
        if close not in self._tag_tokens:
            self._tag_tokens[close] = self.tokenizer.tokenize(close, add_special=False)
        job.thought_close = self._tag_tokens[close]
        state = reasoning.Thought.for_prompt(fmt, prompt).state
        job.thought_start = state
        if state == reasoning.THINKING:
            # What the template wrote after the opening tag (DeepSeek-R1's newline) counts
            # against the budget, as llama.cpp's reasoning budget counts it.
            after = prompt[prompt.rfind(fmt.start.rstrip()) + len(fmt.start.rstrip()) :]
            job.thought_spent = len(self.tokenizer.tokenize(after, add_special=False))
        if job.params.grammar is not None and state != reasoning.ANSWER:
            job.params.grammar = self._past_thought(job.params.grammar, fmt, close, state)

    def _past_thought(
        self, grammar: str, fmt: reasoning.ThinkingFormat, close: str, state: str
    ) -> str:
        """A structured answer's grammar, moved past the model's thought."""

        def tag(text: str) -> structured.Tag:
            if text not in self._tag_grammar:
                tokens = self.grammars.tag(text) if self.grammars is not None else None
                self._tag_grammar[text] = (text, tokens)
            return self._tag_grammar[text]

        direct = tag(fmt.openers[-1]) if fmt.openers else None
        return structured.after_thought(
            grammar, tag(fmt.start), tag(close), opened=state == reasoning.THINKING, direct=direct
        )

    def _with_images(self, job: Job, text: str, images: list[bytes]) -> list[int]:
        """The token list of a prompt with images; its chunks wait on the job for the store."""
        assert self.vision is not None
        tokens, chunks = self.vision.tokenize(text, images)
        job.image_chunks = chunks
        job.images = {chunk.first: chunk.key for chunk in chunks}
        if not tokens or tokens[-1] < 0:
            # The first sampled token needs the logits of a text token after the image.
            raise bad_image("the prompt must not end with an image.", "messages")
        return tokens

    def _check_fits(self, n_prompt: int, wanted: int | None, param: str) -> None:
        ctx = self.ctx_per_slot
        if n_prompt >= ctx:
            raise EngineError(
                f"This model's context is {ctx} tokens per slot, but the prompt has "
                f"{n_prompt} tokens, which leaves no room for a completion. Shorten the {param}.",
                status_code=400,
                code="context_length_exceeded",
                param=param,
            )
        if wanted is not None and n_prompt + wanted > ctx:
            # OpenAI refuses a completion that cannot fit rather than cutting it short.
            raise EngineError(
                f"This model's context is {ctx} tokens per slot. However, you "
                f"requested {n_prompt + wanted} tokens ({n_prompt} in the {param}, "
                f"{wanted} in the completion). Reduce the length of the {param} or the "
                "completion, or start the server with a larger --ctx-size.",
                status_code=400,
                code="context_length_exceeded",
                param="max_tokens",
            )

    def _completion_prompts(self, prompt: Any) -> tuple[list[str], list[list[int]]]:
        items = _items(prompt)
        if items is None:
            raise invalid(
                "'prompt' must be a string, a list of strings, or token arrays.",
                param="prompt",
                code="invalid_type",
                cls=EngineError,
            )
        texts, prompts = [], []
        for item in items:
            if isinstance(item, str):
                tokens = self.tokenizer.tokenize(item, add_special=True)
                text = item
            else:
                self._check_token_ids(item, "prompt")
                tokens = list(item)
                text = b"".join(self.tokenizer.piece(t) for t in tokens).decode("utf-8", "replace")
            if not tokens:
                # An empty prompt still needs one position to sample from.
                tokens = [self.tokenizer.bos]
            texts.append(text)
            prompts.append(tokens)
        return texts, prompts

    def _check_token_ids(self, tokens: list[int], param: str) -> None:
        n_vocab = self.tokenizer.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise invalid(
                f"Token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1}).",
                param=param,
                cls=EngineError,
            )

    def _embedding_inputs(self, body: dict[str, Any]) -> list[list[int]]:
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise invalid(
                "'encoding_format' must be 'float' or 'base64'.",
                param="encoding_format",
                cls=EngineError,
            )
        dims = body.get("dimensions")
        if dims is not None and dims != self.embedding_dim:
            raise invalid(
                f"This model's embeddings have {self.embedding_dim} dimensions and cannot be "
                f"shortened; omit 'dimensions' or set it to {self.embedding_dim}.",
                param="dimensions",
                cls=EngineError,
            )
        items = _items(body.get("input"))
        if items is None:
            raise invalid(
                "'input' must be a non-empty string, list of strings, or token arrays.",
                param="input",
                code="invalid_type",
                cls=EngineError,
            )
        inputs = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if not item:
                    raise invalid(
                        f"input[{i}] is empty; every input needs text.",
                        param="input",
                        cls=EngineError,
                    )
                tokens = self.tokenizer.tokenize(item, add_special=True, parse_special=False)
            else:
                self._check_token_ids(item, "input")
                tokens = list(item)
            if len(tokens) > self.ctx_per_slot:
                raise EngineError(
                    f"input[{i}] has {len(tokens)} tokens; this model embeds at most "
                    f"{self.ctx_per_slot}.",
                    code="context_length_exceeded",
                    param="input",
                )
            inputs.append(tokens)
        return inputs
