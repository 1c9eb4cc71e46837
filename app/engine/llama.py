"""Continuous-batching inference over llama.cpp's low-level API; one thread owns the model.

Callers `submit()` an OpenAI request body from any thread and get a Future. The owner
thread keeps `slots` sequences in one llama context: every step it puts one token per
generating sequence plus prompt chunks of newly admitted requests into a single
llama_batch, calls llama_decode once, samples each sequence from its own row of logits,
frees the slots of sequences that ended and admits the next queued requests at once.
"""

from __future__ import annotations

import base64
import codecs
import ctypes
import hashlib
import heapq
import itertools
import logging
import os
import re
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc
import numpy as np

from app.config import KV_CACHE_TYPES, Settings, kv_needs_flash_attention
from app.engine.base import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    ENDPOINTS,
    ChunkCallback,
    EngineError,
    EngineStats,
    ModelInfo,
    Priority,
    RequestCancelled,
)
from app.engine.chat import ChatTemplate
from app.engine.cpu_check import extra_buffers
from app.engine.sampling import (
    SamplingParams,
    StopMatcher,
    build_sampler,
    free_sampler,
    parse_sampling,
    top_logprobs_of,
)
from app.errors import invalid

log = logging.getLogger("batchyard.engine")

#: Sliding window for the live tokens/s figure.
RATE_WINDOW_S = 5.0
#: Prompt tokens admitted per step. Bounded so that a long new prompt delays the tokens of
#: the sequences already generating by one ubatch at most, not by its whole length.
PROMPT_TOKENS_PER_STEP = 512
#: Slots batch lines may not take: they stay free for online requests.
ONLINE_RESERVED_SLOTS = 1
#: While an online request decodes, each step takes at most this many batch sequences, in
#: turns: a step's cost grows with its rows, and the online tokens should not wait for 31.
ONLINE_BATCH_WINDOW = 8
#: Inputs embedded per llama_decode.
EMBED_SEQS = 32
#: A new prompt copies another slot's KV stream when that shares at least this many more
#: prompt tokens than the slot it lands in. Copying a stream moves the whole ctx_size
#: buffer, which costs about as much as evaluating a few tokens in a batched step.
MIN_COPY_TOKENS = 8


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _ftype_names() -> dict[int, str]:
    names = {}
    for key, value in vars(lc).items():
        if key.startswith("LLAMA_FTYPE_") and isinstance(value, int):
            names.setdefault(value, key.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_"))
    return names


def _meta(model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(4096)
    n = lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def _gpu_backend_name() -> str | None:
    """The first GPU device's backend registry name (CUDA, Metal, Vulkan, ...) via ggml."""
    lib_dir = Path(lc.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            ggml = ctypes.CDLL(str(lib_dir / name))
            break
    else:
        return None
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) != 0:  # 0 is GGML_BACKEND_DEVICE_TYPE_CPU
            return ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(dev)).decode()
    return None


def _closed() -> EngineError:
    return EngineError(
        "The engine is shut down.", status_code=503, code="engine_closed", type="server_error"
    )


def _cpu_threads(requested: int) -> int:
    if requested > 0:
        return requested
    # llama.cpp's own default is a fixed 4, which oversubscribes small machines.
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass
class Choice:
    """One output sequence of a request."""

    index: int
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    started: bool = False  # the streamed role chunk went out


class Job:
    """One submitted request and everything its response needs."""

    def __init__(
        self,
        endpoint: str,
        body: dict[str, Any],
        priority: Priority,
        on_chunk: ChunkCallback | None,
    ) -> None:
        self.endpoint = endpoint
        self.body = body
        self.priority = priority
        self.on_chunk = on_chunk
        self.future: Future[dict[str, Any]] = Future()
        self.created = int(time.time())
        prefix = {"chat": "chatcmpl-", "completion": "cmpl-"}.get(self.kind, "emb-")
        self.id = prefix + uuid.uuid4().hex[:24]
        self.params = SamplingParams()
        self.prompts: list[list[int]] = []  # token ids per prompt
        self.prompt_texts: list[str] = []
        self.choices: list[Choice] = []
        self.unfinished = 0
        self.cached_tokens = 0  # prompt tokens taken from KV already in the cache
        self.cancelled = False
        self.stop_strings: list[str] = []
        self.echo = False
        self.include_usage = False

    @property
    def kind(self) -> str:
        return {CHAT: "chat", COMPLETIONS: "completion", EMBEDDINGS: "embedding"}[self.endpoint]


@dataclass(order=True)
class Task:
    """A unit of queued work: up to `slots` choices of one prompt, which share its evaluation."""

    priority: int
    seq_no: int
    job: Job = field(compare=False)
    prompt_index: int = field(compare=False, default=0)
    choice_indices: list[int] = field(compare=False, default_factory=list)


class Slot:
    """One llama.cpp sequence (seq_id) and the choice decoding in it."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        # The tokens whose KV this sequence holds, at positions 0.. in order. They outlive the
        # request (like llama.cpp server's cache_prompt): the next prompt sharing a prefix with
        # them only evaluates the rest.
        self.cached: list[int] = []
        self.clear()

    def clear(self) -> None:
        self.job: Job | None = None
        self.choice: Choice | None = None
        self.pending: list[int] = []  # prompt tokens not yet decoded
        self.pos = 0  # tokens of this sequence in the KV cache
        self.prompt_len = 0
        self.sampler: Any = None
        self.token = -1  # the last sampled token, fed in the next step
        self.i_batch = -1  # row of logits to sample after this step's decode
        self.followers: list[Slot] = []  # slots that get a copy of this prompt's KV (n > 1)
        self.leader: Slot | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops: StopMatcher = StopMatcher([])
        self.max_tokens = 0

    @property
    def busy(self) -> bool:
        return self.job is not None

    @property
    def generating(self) -> bool:
        return self.job is not None and self.token >= 0


class LlamaEngine:
    """The Engine protocol over one llama.cpp model with continuous batching."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        lc.llama_backend_init()
        if settings.log_level.lower() != "debug":
            from llama_cpp import _logger

            _logger.set_verbose(False)
        path = settings.model_path
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        model_params = lc.llama_model_default_params()
        # -1 means "every layer", which llama.cpp spells as any number above the layer count.
        model_params.n_gpu_layers = (
            0x7FFFFFFF if settings.n_gpu_layers < 0 else settings.n_gpu_layers
        )
        self.threads = _cpu_threads(settings.threads)
        # llama.cpp's extra CPU buffer types (AMX, repacked weights) are much faster where the
        # build is sound and crash where it is not; a child process checks once (cpu_check).
        self.extra_buffers, why = extra_buffers(path, self.threads)
        model_params.use_extra_bufts = self.extra_buffers
        log.info("cpu extra buffer types: %s (%s)", "on" if self.extra_buffers else "off", why)
        self._model = lc.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        self.n_slots = settings.slots

        ctx_params = lc.llama_context_default_params()
        ctx_params.n_seq_max = self.n_slots
        ctx_params.n_ctx = settings.ctx_size * self.n_slots
        # Separate KV streams give each sequence its own ctx_size context and keep attention
        # per sequence; n > 1 copies a whole stream with llama_memory_seq_cp.
        ctx_params.kv_unified = False
        self.n_batch = max(2048, self.n_slots + PROMPT_TOKENS_PER_STEP)
        ctx_params.n_batch = self.n_batch
        ctx_params.n_ubatch = 512
        ctx_params.n_threads = self.threads
        ctx_params.n_threads_batch = self.threads
        ctx_params.no_perf = True
        self.kv_cache_type = settings.kv_cache_type
        ctx_params.type_k = ctx_params.type_v = KV_CACHE_TYPES[self.kv_cache_type]
        ctx_params.flash_attn_type = (
            lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if kv_needs_flash_attention(self.kv_cache_type)
            else lc.LLAMA_FLASH_ATTN_TYPE_AUTO
        )
        self._ctx = lc.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        self.ctx_per_slot = lc.llama_n_ctx_seq(self._ctx)
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._embed_ctx: Any = None

        self.chat_template = ChatTemplate(
            lc.llama_model_chat_template(self._model, None)
            and lc.llama_model_chat_template(self._model, None).decode(),
            self._token_text(lc.llama_vocab_bos(self._vocab)),
            self._token_text(lc.llama_vocab_eos(self._vocab)),
        )
        self.info = self._model_info(path)
        self._fingerprint = (
            "fp_" + hashlib.sha256(f"{self.info.id}/{lc.__version__}".encode()).hexdigest()[:10]
        )

        self._cond = threading.Condition()
        self._prepare_lock = threading.Lock()
        self._queue: list[Task] = []
        self._seq = itertools.count()
        self._jobs: dict[Future[dict[str, Any]], Job] = {}
        self._closing = False
        self._slots = [Slot(i) for i in range(self.n_slots)]
        # Slots whose stream copy llama.cpp has queued but not yet done (it happens at the
        # next decode); they are not a source for another copy until then.
        self._copy_pending: set[int] = set()
        self._window = 0  # the batch slots' turn while online requests decode (_held_back)
        self._stats = EngineStats()
        self._rate: deque[tuple[float, int]] = deque()
        self._stats_lock = threading.Lock()

        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)
        self._thread.start()
        log.info(
            "engine ready: model=%s backend=%s slots=%d ctx/slot=%d kv=%s threads=%d",
            self.info.id,
            self.info.backend,
            self.n_slots,
            self.ctx_per_slot,
            self.kv_cache_type,
            self.threads,
        )

    # ----------------------------------------------------------------- the public contract

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        job = Job(endpoint, body, Priority(priority), on_chunk)
        # Preparing reads the vocabulary, so it must not overlap close() freeing the model.
        with self._prepare_lock:
            if self._closing:
                job.future.set_exception(_closed())
                return job.future
            try:
                tasks = self._prepare(job)
            except EngineError as exc:
                job.future.set_exception(exc)
                self._count("failed")
                return job.future
        with self._cond:
            if self._closing:
                job.future.set_exception(_closed())
                return job.future
            self._jobs[job.future] = job
            for task in tasks:
                heapq.heappush(self._queue, task)
            self._stats.queue_depth += len(tasks)
            self._cond.notify()
        return job.future

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        with self._cond:
            job = self._jobs.pop(future, None)
            if job is None or job.future.done():
                return
            job.cancelled = True  # the owner thread drops its queued tasks and frees its slots
            self._cond.notify()
        if self._settle(job, error=RequestCancelled()):
            self._count("cancelled")

    def stats(self) -> EngineStats:
        with self._stats_lock:
            now = time.monotonic()
            while self._rate and self._rate[0][0] < now - RATE_WINDOW_S:
                self._rate.popleft()
            tokens = sum(n for _, n in self._rate)
            span = min(RATE_WINDOW_S, now - self._rate[0][0]) if self._rate else 0.0
            return EngineStats(
                active_slots=sum(1 for s in self._slots if s.busy),
                queue_depth=self._stats.queue_depth,
                tokens_per_second=tokens / span if span > 0.05 else 0.0,
                prompt_tokens_total=self._stats.prompt_tokens_total,
                completion_tokens_total=self._stats.completion_tokens_total,
                requests_total=dict(self._stats.requests_total),
            )

    def close(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
        self._thread.join()
        with self._prepare_lock:
            self._free()

    def _free(self) -> None:
        lc.llama_batch_free(self._batch)
        if self._embed_ctx:
            lc.llama_free(self._embed_ctx)
        lc.llama_free(self._ctx)
        lc.llama_model_free(self._model)

    # ------------------------------------------------------------------ request preparation

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        buf = (lc.llama_token * size)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, parse_special)
        if n < 0:
            size = -n
            buf = (lc.llama_token * size)()
            n = lc.llama_tokenize(
                self._vocab, data, len(data), buf, size, add_special, parse_special
            )
        return list(buf[:n])

    def _piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def _token_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    def _prepare(self, job: Job) -> list[Task]:
        """Validate, template and tokenize in the caller's thread, so the queue holds ready work."""
        body = job.body
        if not isinstance(body, dict):
            raise invalid(
                "The request body must be a JSON object.",
                param="body",
                code="invalid_type",
                cls=EngineError,
            )
        if job.kind == "embedding":
            job.prompts = self._embedding_inputs(body)
            return [Task(int(job.priority), next(self._seq), job)]
        chat = job.kind == "chat"
        job.params = parse_sampling(body, chat=chat, n_vocab=self.n_vocab)
        stream_options = body.get("stream_options")
        job.include_usage = bool(
            isinstance(stream_options, dict) and stream_options.get("include_usage")
        )
        if chat:
            text = self.chat_template.render(body.get("messages"))
            job.prompt_texts = [text]
            job.prompts = [self.tokenize(text, add_special=False)]
            job.stop_strings = job.params.stop + self.chat_template.stop_strings()
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
        for tokens in job.prompts:
            if len(tokens) >= self.ctx_per_slot:
                raise EngineError(
                    f"This model's context is {self.ctx_per_slot} tokens per slot, but the prompt has "
                    f"{len(tokens)} tokens, which leaves no room for a completion. Shorten the {param}.",
                    status_code=400,
                    code="context_length_exceeded",
                    param=param,
                )
            wanted = job.params.max_tokens
            if wanted is not None and len(tokens) + wanted > self.ctx_per_slot:
                # OpenAI refuses a completion that cannot fit rather than cutting it short.
                raise EngineError(
                    f"This model's context is {self.ctx_per_slot} tokens per slot. However, you "
                    f"requested {len(tokens) + wanted} tokens ({len(tokens)} in the {param}, "
                    f"{wanted} in the completion). Reduce the length of the {param} or the "
                    "completion, or start the server with a larger --ctx-size.",
                    status_code=400,
                    code="context_length_exceeded",
                    param="max_tokens",
                )
        n = job.params.n
        job.choices = [Choice(i) for i in range(n * len(job.prompts))]
        job.unfinished = len(job.choices)
        tasks = []
        for p in range(len(job.prompts)):
            # A task never needs more slots than exist; bigger n is evaluated in groups.
            for start in range(0, n, self.n_slots):
                indices = [p * n + k for k in range(start, min(n, start + self.n_slots))]
                tasks.append(Task(int(job.priority), next(self._seq), job, p, indices))
        return tasks

    def _completion_prompts(self, prompt: Any) -> tuple[list[str], list[list[int]]]:
        def is_tokens(x: Any) -> bool:
            return (
                isinstance(x, list)
                and bool(x)
                and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
            )

        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif is_tokens(prompt):
            items = [prompt]
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, str) or is_tokens(p) for p in prompt)
        ):
            items = prompt
        else:
            raise invalid(
                "'prompt' must be a string, a list of strings, or token arrays.",
                param="prompt",
                code="invalid_type",
                cls=EngineError,
            )
        texts, prompts = [], []
        for item in items:
            if isinstance(item, str):
                tokens = self.tokenize(item, add_special=True)
                text = item
            else:
                self._check_token_ids(item, "prompt")
                tokens = list(item)
                text = b"".join(self._piece(t) for t in tokens).decode("utf-8", "replace")
            if not tokens:
                # An empty prompt still needs one position to sample from.
                tokens = [lc.llama_vocab_bos(self._vocab)]
            texts.append(text)
            prompts.append(tokens)
        return texts, prompts

    def _check_token_ids(self, tokens: list[int], param: str) -> None:
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise invalid(
                f"Token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1}).",
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
        if dims is not None and dims != self.info.embedding_dim:
            raise invalid(
                f"This model's embeddings have {self.info.embedding_dim} dimensions and cannot be "
                f"shortened; omit 'dimensions' or set it to {self.info.embedding_dim}.",
                param="dimensions",
                cls=EngineError,
            )
        raw = body.get("input")

        def is_tokens(x: Any) -> bool:
            return (
                isinstance(x, list)
                and bool(x)
                and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
            )

        if isinstance(raw, str) or is_tokens(raw):
            items: list[Any] = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, str) or is_tokens(x) for x in raw):
            items = raw
        else:
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
                tokens = self.tokenize(item, add_special=True, parse_special=False)
            else:
                self._check_token_ids(item, "input")
                tokens = list(item)
            if len(tokens) > self.ctx_per_slot:
                raise EngineError(
                    f"input[{i}] has {len(tokens)} tokens; this model embeds at most {self.ctx_per_slot}.",
                    code="context_length_exceeded",
                    param="input",
                )
            inputs.append(tokens)
        return inputs

    # ---------------------------------------------------------------------- the owner thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while (
                        not self._closing
                        and not self._queue
                        and not any(s.busy for s in self._slots)
                    ):
                        self._cond.wait()
                    if self._closing:
                        break
                    self._drop_cancelled()
                    work = self._admit()
                for job in work:
                    self._embed(job)
                if any(s.busy for s in self._slots):
                    self._step()
        except Exception:  # a broken context is not a request error: fail everything, loudly
            log.exception("engine thread crashed")
        finally:
            self._fail_all(_closed())

    def _drop_cancelled(self) -> None:
        before = len(self._queue)
        self._queue = [t for t in self._queue if not t.job.cancelled]
        if len(self._queue) != before:
            heapq.heapify(self._queue)
            self._stats.queue_depth = len(self._queue)
        for slot in self._slots:
            if slot.busy and slot.job is not None and slot.job.cancelled:
                self._release(slot)

    def _admit(self) -> list[Job]:
        """Move queued tasks into free slots, highest priority first; returns embedding jobs."""
        embeds = []
        free = [s for s in self._slots if not s.busy]
        # One slot is kept from batch lines, so an online request never waits for a batch
        # line to finish (they run to max_tokens); with a single slot nothing is kept.
        batch_room = self.n_slots - ONLINE_RESERVED_SLOTS if self.n_slots > 1 else 1
        batch_busy = sum(
            1 for s in self._slots if s.job is not None and s.job.priority == Priority.BATCH
        )
        while self._queue:
            task = self._queue[0]
            if task.job.cancelled:
                heapq.heappop(self._queue)
                self._stats.queue_depth -= 1
                continue
            if task.job.kind == "embedding":
                heapq.heappop(self._queue)
                self._stats.queue_depth -= 1
                embeds.append(task.job)
                continue
            if len(task.choice_indices) > len(free):
                break  # strict order: the head waits for enough slots rather than be overtaken
            want = len(task.choice_indices)
            # llama.cpp cuts a batch over separate KV streams into one forward pass per run of
            # consecutive sequence ids, so batch lines keep to the lowest slots and online
            # requests take the highest first: then the sequences of a step form one run.
            if task.job.priority == Priority.BATCH:
                if batch_busy + want > batch_room and batch_busy > 0:
                    break  # online tasks sort first, so nothing behind this one may go either
                batch_busy += want
                pool = [s for s in free if s.seq_id < batch_room]
            else:
                pool = [s for s in free if s.seq_id >= batch_room]
            if len(pool) < want:
                pool = list(free)
            heapq.heappop(self._queue)
            self._stats.queue_depth -= 1
            prompt = task.job.prompts[task.prompt_index]
            # The leader lands in the free slot that already holds the longest prefix of the
            # prompt; ties go to the slot with the least cached, so longer caches survive.
            leader = max(pool, key=lambda s: (_common_prefix(s.cached, prompt), -len(s.cached)))
            pool.remove(leader)
            # Siblings (n > 1) get a full copy of the leader's stream, so their caches go.
            pool.sort(key=lambda s: len(s.cached))
            group = [leader] + [pool.pop(0) for _ in task.choice_indices[1:]]
            for slot in group:
                free.remove(slot)
            self._start(task, group)
        return embeds

    def _reuse_prefix(self, slot: Slot, prompt: list[int]) -> int:
        """Make `slot`'s KV hold the longest cached prefix of `prompt`; returns its length.

        Always leaves at least the last prompt token to evaluate: the first sampled token
        needs its logits.
        """
        limit = len(prompt) - 1 if self.settings.prefix_cache else 0
        own = min(_common_prefix(slot.cached, prompt), limit)
        best, source = own, None
        for other in self._slots:
            if other is slot or other.seq_id in self._copy_pending:
                continue
            shared = min(_common_prefix(other.cached, prompt), limit)
            if shared > best:
                best, source = shared, other
        if source is not None and best >= own + MIN_COPY_TOKENS:
            # Separate KV streams only copy whole streams (llama.cpp queues the buffer copy
            # for the next decode); the tail past the shared prefix is dropped right after.
            lc.llama_memory_seq_cp(self._mem, source.seq_id, slot.seq_id, -1, -1)
            slot.cached = list(source.cached)
            self._copy_pending.add(slot.seq_id)
            own = best
        if len(slot.cached) > own:
            lc.llama_memory_seq_rm(self._mem, slot.seq_id, own, -1)
            del slot.cached[own:]
        return own

    def _start(self, task: Task, group: list[Slot]) -> None:
        job = task.job
        prompt = job.prompts[task.prompt_index]
        leader = group[0]
        for slot, index in zip(group, task.choice_indices, strict=True):
            slot.clear()
            slot.job = job
            slot.choice = job.choices[index]
            slot.prompt_len = len(prompt)
            # Plain greedy takes the argmax itself (_sample) and needs no sampler chain.
            slot.sampler = (
                None
                if job.params.plain_greedy
                else build_sampler(
                    job.params,
                    self._vocab,
                    self.n_vocab,
                    job.params.choice_seed(index),
                    self.ctx_per_slot,
                )
            )
            slot.stops = StopMatcher(job.stop_strings)
            room = self.ctx_per_slot - len(prompt)
            slot.max_tokens = min(job.params.max_tokens or room, room)
            if slot is not leader:
                slot.leader = leader
                leader.followers.append(slot)
        reused = self._reuse_prefix(leader, prompt)
        leader.pos = reused
        leader.pending = prompt[reused:]
        job.cached_tokens += reused
        with self._stats_lock:
            self._stats.prompt_tokens_total += len(prompt)

    def _step(self) -> None:
        """One llama_decode over every sequence that has work, then sample and retire."""
        batch = self._batch
        n = 0
        generating = [s for s in self._slots if s.generating]
        budget = min(self.n_batch - len(generating), PROMPT_TOKENS_PER_STEP)
        held = self._held_back()
        # Sequences go in seq_id order: llama.cpp splits a multi-stream batch into ubatches of
        # consecutive sequence ids, so order keeps a step to as few ubatches as possible.
        for slot in self._slots:
            slot.i_batch = -1
            if slot.seq_id in held:
                continue  # a batch line sits this step out; its next token waits in slot.token
            if slot.generating:
                n = self._add(batch, n, slot.token, slot.pos, slot.seq_id, True)
                slot.cached.append(slot.token)
                slot.pos += 1
                slot.i_batch = n - 1
            elif slot.pending and budget > 0:
                take = min(len(slot.pending), budget)
                chunk, slot.pending = slot.pending[:take], slot.pending[take:]
                for j, token in enumerate(chunk):
                    last = not slot.pending and j == take - 1
                    n = self._add(batch, n, token, slot.pos, slot.seq_id, last)
                    slot.pos += 1
                slot.cached.extend(chunk)
                budget -= take
                if not slot.pending:
                    slot.i_batch = n - 1
        if n == 0:
            return
        batch.n_tokens = n
        rc = lc.llama_decode(self._ctx, batch)
        self._copy_pending.clear()
        if rc != 0:
            # Per-sequence contexts are sized so this cannot happen for admitted work; if it
            # does, fail the requests in this batch rather than the engine.
            log.error("llama_decode returned %d; failing the sequences of this step", rc)
            for slot in self._slots:
                if slot.busy and (slot.i_batch >= 0 or slot.generating):
                    self._fail_job(
                        slot.job,
                        EngineError(
                            f"llama_decode failed ({rc}).",
                            status_code=500,
                            code="decode_failed",
                            type="server_error",
                        ),
                    )
            # What the failed batch left in KV is unknown: free slots forget their caches.
            for slot in self._slots:
                if not slot.busy:
                    lc.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
                    slot.cached = []
            return
        sampled = 0
        for slot in self._slots:
            if slot.i_batch < 0 or slot.job is None:
                continue
            for follower in slot.followers:
                # The prompt was evaluated once; its KV becomes the start of every sibling choice.
                lc.llama_memory_seq_cp(self._mem, slot.seq_id, follower.seq_id, -1, -1)
                follower.cached = list(slot.cached)
                self._copy_pending.add(follower.seq_id)
                follower.pos = slot.pos
                follower.i_batch = slot.i_batch
            slot.followers = []
        for slot in self._slots:
            if slot.i_batch >= 0 and slot.job is not None:
                self._sample(slot)
                sampled += 1
        now = time.monotonic()
        with self._stats_lock:
            self._rate.append((now, sampled))
            self._stats.completion_tokens_total += sampled
        with self._cond:
            self._drop_cancelled()
            work = self._admit()
        for job in work:
            self._embed(job)

    def _held_back(self) -> set[int]:
        """The batch slots that sit this step out so that an online request decodes quickly."""
        if not any(s.job is not None and s.job.priority == Priority.ONLINE for s in self._slots):
            return set()
        batch_slots = [
            s.seq_id for s in self._slots if s.job is not None and s.job.priority == Priority.BATCH
        ]
        if len(batch_slots) <= ONLINE_BATCH_WINDOW:
            return set()
        # Windows of consecutive slots in turn: each step stays one run of sequence ids.
        self._window = (self._window + 1) % -(-len(batch_slots) // ONLINE_BATCH_WINDOW)
        start = self._window * ONLINE_BATCH_WINDOW
        return set(batch_slots[:start] + batch_slots[start + ONLINE_BATCH_WINDOW :])

    @staticmethod
    def _add(batch: Any, n: int, token: int, pos: int, seq_id: int, logits: bool) -> int:
        batch.token[n] = token
        batch.pos[n] = pos
        batch.n_seq_id[n] = 1
        batch.seq_id[n][0] = seq_id
        batch.logits[n] = logits
        return n + 1

    def _sample(self, slot: Slot) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        if job.params.plain_greedy:
            # The argmax of the row, as llama.cpp's greedy sampler picks it (first of equals),
            # without building its 49,152-entry candidate array: 14 instead of 110 us a token.
            row = lc.llama_get_logits_ith(self._ctx, slot.i_batch)
            token = int(np.ctypeslib.as_array(row, shape=(self.n_vocab,)).argmax())
        else:
            token = lc.llama_sampler_sample(slot.sampler, self._ctx, slot.i_batch)
        if lc.llama_vocab_is_eog(self._vocab, token):
            self._finish(slot, "stop")
            return
        choice.completion_tokens += 1
        piece = self._piece(token)
        if job.params.logprobs:
            self._record_logprob(slot, token, piece)
        text = slot.stops.feed(slot.decoder.decode(piece))
        if text:
            choice.text += text
            self._emit(job, choice, text)
        if slot.stops.stopped:
            self._finish(slot, "stop")
        elif choice.completion_tokens >= slot.max_tokens or slot.pos >= self.ctx_per_slot:
            self._finish(slot, "length")
        else:
            slot.token = token

    def _record_logprob(self, slot: Slot, token: int, piece: bytes) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        logp, top = top_logprobs_of(
            lc.llama_get_logits_ith(self._ctx, slot.i_batch), self.n_vocab, job.params.top_logprobs
        )
        entry = {
            "token": piece.decode("utf-8", "replace"),
            "logprob": float(logp[token]),
            "bytes": list(piece),
            "top_logprobs": [],
        }
        for t in top:
            p = self._piece(t)
            entry["top_logprobs"].append(
                {"token": p.decode("utf-8", "replace"), "logprob": float(logp[t]), "bytes": list(p)}
            )
        choice.logprobs.append(entry)

    def _finish(self, slot: Slot, reason: str) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        tail = slot.stops.feed(slot.decoder.decode(b"", final=True)) + slot.stops.flush()
        if tail:
            choice.text += tail
            self._emit(job, choice, tail)
        choice.finish_reason = reason
        self._emit(job, choice, None)
        self._release(slot)
        job.unfinished -= 1
        if job.unfinished == 0:
            self._complete(job)

    def _release(self, slot: Slot) -> None:
        for follower in slot.followers:  # siblings still waiting for this prompt lose their source
            if follower.job is not None and follower.job.cancelled:
                self._release(follower)
        free_sampler(slot.sampler)
        # The KV stays, and slot.cached says what it holds, for a later prompt to reuse.
        slot.clear()

    # ------------------------------------------------------------------------------ bodies

    def _usage(self, job: Job) -> dict[str, Any]:
        # OpenAI counts every prompt token, cached or not, and reports the cached part apart.
        prompt = sum(len(p) for p in job.prompts)
        completion = sum(c.completion_tokens for c in job.choices)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if job.kind == "chat":
            usage["prompt_tokens_details"] = {"cached_tokens": job.cached_tokens}
        return usage

    def _complete(self, job: Job) -> None:
        if job.on_chunk and job.include_usage:
            self._call_chunk(
                job, {**self._chunk_head(job), "choices": [], "usage": self._usage(job)}
            )
        if job.kind == "chat":
            choices = [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text, "refusal": None},
                    "logprobs": {"content": c.logprobs, "refusal": None}
                    if job.params.logprobs
                    else None,
                    "finish_reason": c.finish_reason,
                }
                for c in job.choices
            ]
            body = {
                "id": job.id,
                "object": "chat.completion",
                "created": job.created,
                "model": self.info.id,
                "choices": choices,
            }
        else:
            n = job.params.n
            choices = [
                {
                    "index": c.index,
                    "text": (job.prompt_texts[c.index // n] if job.echo else "") + c.text,
                    "logprobs": self._completion_logprobs(c) if job.params.logprobs else None,
                    "finish_reason": c.finish_reason,
                }
                for c in job.choices
            ]
            body = {
                "id": job.id,
                "object": "text_completion",
                "created": job.created,
                "model": self.info.id,
                "choices": choices,
            }
        body["usage"] = self._usage(job)
        body["system_fingerprint"] = self._fingerprint
        if self._settle(job, result=body):
            self._count("succeeded")

    @staticmethod
    def _completion_logprobs(choice: Choice) -> dict[str, Any]:
        offsets, at = [], 0
        for e in choice.logprobs:
            offsets.append(at)
            at += len(e["token"])
        return {
            "tokens": [e["token"] for e in choice.logprobs],
            "token_logprobs": [e["logprob"] for e in choice.logprobs],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in choice.logprobs
            ],
            "text_offset": offsets,
        }

    def _chunk_head(self, job: Job) -> dict[str, Any]:
        kind = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
        return {
            "id": job.id,
            "object": kind,
            "created": job.created,
            "model": self.info.id,
            "system_fingerprint": self._fingerprint,
        }

    def _emit(self, job: Job, choice: Choice, text: str | None) -> None:
        """Stream one delta (text) or the closing chunk (None) of a choice."""
        if job.on_chunk is None:
            return
        head = self._chunk_head(job)
        if job.kind == "chat":
            if not choice.started:
                choice.started = True
                self._call_chunk(
                    job,
                    {
                        **head,
                        "choices": [
                            {
                                "index": choice.index,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    },
                )
            delta = {"content": text} if text is not None else {}
            self._call_chunk(
                job,
                {
                    **head,
                    "choices": [
                        {
                            "index": choice.index,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": None if text is not None else choice.finish_reason,
                        }
                    ],
                },
            )
        else:
            self._call_chunk(
                job,
                {
                    **head,
                    "choices": [
                        {
                            "index": choice.index,
                            "text": text or "",
                            "logprobs": None,
                            "finish_reason": None if text is not None else choice.finish_reason,
                        }
                    ],
                },
            )

    def _call_chunk(self, job: Job, chunk: dict[str, Any]) -> None:
        assert job.on_chunk is not None
        try:
            job.on_chunk(chunk)
        except Exception:  # a broken stream consumer must not stop the other sequences
            log.exception("on_chunk callback failed for %s", job.id)

    # -------------------------------------------------------------------------- embeddings

    def _embedding_context(self) -> Any:
        if self._embed_ctx:
            return self._embed_ctx
        for pooling in (lc.LLAMA_POOLING_TYPE_UNSPECIFIED, lc.LLAMA_POOLING_TYPE_MEAN):
            params = lc.llama_context_default_params()
            params.embeddings = True
            params.pooling_type = pooling
            params.n_ctx = self.ctx_per_slot
            params.n_batch = params.n_ubatch = (
                self.ctx_per_slot
            )  # a pooled input must fit one ubatch
            params.n_seq_max = EMBED_SEQS
            params.kv_unified = True  # inputs share one buffer; each decode starts empty
            params.n_threads = params.n_threads_batch = self.threads
            params.no_perf = True
            ctx = lc.llama_init_from_model(self._model, params)
            if not ctx:
                raise EngineError(
                    "Could not create the embeddings context.",
                    status_code=500,
                    code="embeddings_unavailable",
                    type="server_error",
                )
            if lc.llama_pooling_type(ctx) != lc.LLAMA_POOLING_TYPE_NONE:
                self._embed_ctx = ctx
                return ctx
            # The model defines no pooling (a generative model): mean-pool like OpenAI-style servers.
            lc.llama_free(ctx)
        raise EngineError(
            "This model cannot produce pooled embeddings.",
            status_code=500,
            code="embeddings_unavailable",
            type="server_error",
        )

    def _embed(self, job: Job) -> None:
        if job.cancelled or job.future.done():
            return
        try:
            ctx = self._embedding_context()
            mem = lc.llama_get_memory(ctx)
            batch = lc.llama_batch_init(self.ctx_per_slot, 0, 1)
            vectors: list[np.ndarray] = []
            try:
                pending = list(job.prompts)
                while pending:
                    group, used = [], 0
                    while (
                        pending
                        and len(group) < EMBED_SEQS
                        and used + len(pending[0]) <= self.ctx_per_slot
                    ):
                        used += len(pending[0])
                        group.append(pending.pop(0))
                    n = 0
                    for seq, tokens in enumerate(group):
                        for pos, token in enumerate(tokens):
                            n = self._add(batch, n, token, pos, seq, True)
                    batch.n_tokens = n
                    lc.llama_memory_clear(mem, True)
                    if lc.llama_decode(ctx, batch) != 0:
                        raise EngineError(
                            "llama_decode failed on the embeddings context.",
                            status_code=500,
                            code="decode_failed",
                            type="server_error",
                        )
                    dim = self.info.embedding_dim
                    for seq in range(len(group)):
                        vec = np.ctypeslib.as_array(
                            lc.llama_get_embeddings_seq(ctx, seq), shape=(dim,)
                        ).astype(np.float32)
                        norm = float(np.linalg.norm(vec))
                        vectors.append(vec / norm if norm > 0 else vec)
            finally:
                lc.llama_memory_clear(mem, True)
                lc.llama_batch_free(batch)
        except EngineError as exc:
            self._fail_job(job, exc)
            return
        base64_out = job.body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                if base64_out
                else [float(x) for x in v],
            }
            for i, v in enumerate(vectors)
        ]
        tokens = sum(len(p) for p in job.prompts)
        with self._stats_lock:
            self._stats.prompt_tokens_total += tokens
        body = {
            "object": "list",
            "data": data,
            "model": self.info.id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        if self._settle(job, result=body):
            self._count("succeeded")

    # ----------------------------------------------------------------------- bookkeeping

    def _settle(
        self, job: Job, *, result: dict[str, Any] | None = None, error: BaseException | None = None
    ) -> bool:
        """Resolve a job's future once; whoever comes second (cancel vs finish) loses quietly."""
        with self._cond:
            self._jobs.pop(job.future, None)
        try:
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result or {})
        except InvalidStateError:
            return False
        return True

    def _fail_job(self, job: Job | None, error: EngineError) -> None:
        if job is None:
            return
        job.cancelled = True  # reuse the withdrawal path to free its slots and queued tasks
        for slot in self._slots:
            if slot.job is job:
                self._release(slot)
        if self._settle(job, error=error):
            self._count("failed")

    def _fail_all(self, error: EngineError) -> None:
        with self._cond:
            self._closing = True
            jobs = list(self._jobs.values())
            self._queue.clear()
            self._stats.queue_depth = 0
        for slot in self._slots:
            if slot.busy:
                self._release(slot)
        for job in jobs:
            if self._settle(job, error=error):
                self._count("failed")

    def _count(self, outcome: str) -> None:
        with self._stats_lock:
            self._stats.requests_total[outcome] = self._stats.requests_total.get(outcome, 0) + 1

    def _model_info(self, path: Path) -> ModelInfo:
        ftype = _meta(self._model, "general.file_type")
        quant = _ftype_names().get(int(ftype)) if ftype and ftype.isdigit() else None
        if quant is None:
            match = re.search(r"(I?Q\d+_[A-Z0-9_]+|F16|BF16|F32)", path.stem, re.IGNORECASE)
            quant = match.group(1).upper() if match else "unknown"
        gpu = _gpu_backend_name() if self.settings.n_gpu_layers != 0 else None
        stat = path.stat()
        return ModelInfo(
            id=path.stem if path.suffix == ".gguf" else path.name,
            path=str(path),
            size_bytes=stat.st_size,
            quantization=quant,
            n_ctx_train=lc.llama_model_n_ctx_train(self._model),
            ctx_per_slot=self.ctx_per_slot,
            n_slots=self.n_slots,
            backend=gpu or "CPU",
            n_gpu_layers=self.settings.n_gpu_layers if gpu else 0,
            embedding_dim=lc.llama_model_n_embd(self._model),
            has_chat_template=self.chat_template.has_template,
            created=int(stat.st_mtime),
        )


def load_engine(settings: Settings) -> LlamaEngine:
    """Load the configured model and start its owner thread."""
    return LlamaEngine(settings)


__all__ = ["LlamaEngine", "load_engine"]
