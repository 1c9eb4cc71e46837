"""Continuous-batching inference over llama.cpp's low-level API; one thread owns the model.

Callers `submit()` an OpenAI request body from any thread and get a Future. The owner
thread keeps `n_slots` sequences in one llama context: every step it puts one token per
generating sequence plus prompt chunks of newly admitted requests into a single
llama_batch, calls llama_decode once, samples each sequence from its own row of logits,
frees the slots of sequences that ended and admits the next queued requests. Where the
model has a shared-prefix context, batch lines that share a long block run there, in
branches forked from the block's cells, and each step gives that context its turn too.

The rooms: native.py loads and wraps llama.cpp, loading.py loads a model into an engine,
prepare.py turns bodies into tasks, slots.py holds the slots and the scheduling decisions,
shared.py the shared-prefix context's decisions, slots_context.py and shared_context.py
carry them out on each context, sequences.py samples and finishes a sequence of either,
answers.py builds the OpenAI bodies, embed.py the embeddings. This module owns the jobs
and the loop that ties them together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from app.config import Settings
from app.engine.base import (
    ChunkCallback,
    EngineError,
    EngineStats,
    Priority,
    RequestCancelled,
    engine_closed,
    resolve,
)
from app.engine.counters import Counters
from app.engine.llama.binding import native, vision
from app.engine.llama.binding.grammars import Grammars
from app.engine.llama.contexts.embed import EMBED_SEQS, Embedder
from app.engine.llama.contexts.sequences import Sequences
from app.engine.llama.contexts.shared import SharedRound
from app.engine.llama.contexts.shared_context import SharedPrefixContext
from app.engine.llama.contexts.slots import Scheduler, Seq
from app.engine.llama.contexts.slots_context import SlotsContext
from app.engine.llama.jobs.jobs import Job, Task
from app.engine.llama.jobs.oai import answers
from app.engine.llama.jobs.oai.chat_template import ChatTemplate
from app.engine.llama.jobs.prepare import Preparer, free_images
from app.engine.llama.thread_priority import effective, lower_this_thread
from app.wire.endpoints import ENDPOINTS

log = logging.getLogger("batchyard.engine")

#: An idle engine's wait for a burst of batch lines to end (`_gather`): a pause this long
#: ends it, and it never lasts longer than BATCH_GATHER_MAX.
BATCH_GATHER_QUIET = 0.01
BATCH_GATHER_MAX = 0.1
#: The longest an engine whose only work is lines waiting for their images' encodes waits
#: before it looks again (the image store wakes it as soon as an image is ready).
IMAGE_WAIT = 0.05


class LlamaEngine:
    """The Engine protocol over one loaded llama.cpp model with continuous batching.

    Building one only sets up its state; `load_engine` loads the model and starts the
    owner thread (`start`).
    """

    def __init__(
        self,
        settings: Settings,
        model: native.LoadedModel,
        *,
        model_id: str | None = None,
        chat_template: str | None = None,
        projector: vision.Projector | None = None,
        projector_error: str | None = None,
    ) -> None:
        self.settings = settings
        self._native = model
        self.vocab = model.vocab
        self.n_vocab = model.vocab.n_vocab
        self.n_slots, self.n_batch = model.n_slots, model.n_batch
        self.ctx_per_slot = model.ctx_per_slot
        self._describe(model, model_id, chat_template, projector, projector_error)
        grammars = Grammars(model.vocab)
        self._preparer = Preparer(
            model.vocab,
            self.chat_template,
            ctx_per_slot=self.ctx_per_slot,
            n_slots=self.n_slots,
            embedding_dim=model.n_embd,
            vision=projector,
            grammars=grammars,
            thought_budget=settings.reasoning_budget,
        )
        self._embedder = Embedder(
            model.model, ctx_size=self.ctx_per_slot, threads=model.threads, dim=model.n_embd
        )
        self._cond = threading.Condition()
        self._prepare_lock = threading.Lock()
        self._queue: list[Task] = []
        self._seq = itertools.count()
        self._jobs: dict[Future[dict[str, Any]], Job] = {}
        self._closing = False
        self._counters = Counters()
        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)
        # Encoded images, and the thread that encodes them beside the decoding (vision.py).
        self._images: vision.ImageStore | None = None
        if projector is not None:
            self._images = vision.ImageStore(projector, on_ready=self._wake)
        self._build_contexts(model, projector, grammars)

    def _describe(
        self,
        model: native.LoadedModel,
        model_id: str | None,
        chat_template: str | None,
        projector: vision.Projector | None,
        projector_error: str | None,
    ) -> None:
        """The model as answers and the registry see it: its chat template, its `info` (under
        the catalog's id), what its load took, and the fingerprint answers carry."""
        self.chat_template = ChatTemplate(
            chat_template or model.chat_template,
            model.vocab.token_text(model.vocab.bos),
            model.vocab.token_text(model.vocab.eos),
        )
        self.info = model.model_info(
            has_chat_template=self.chat_template.has_template,
            n_gpu_layers=model.n_gpu_layers,
        )
        if model_id:
            # Answers carry the name the catalog knows the model by, not the file's stem.
            self.info = dataclasses.replace(self.info, id=model_id)
        self.chat_template.model_id = self.info.id
        self.chat_template.no_projector_why = projector_error
        self._projector = projector
        self.info = dataclasses.replace(self.info, takes_images=projector is not None)
        #: Bytes the projector's load took (within measured_bytes).
        self.projector_bytes: int | None = None
        #: Bytes the load took (the buffers llama.cpp reported for it: loading.py), and
        #: seconds.
        self.measured_bytes: int | None = None
        self.load_seconds: float | None = None
        self.freed_bytes: int | None = None
        self._fingerprint = (
            "fp_"
            + hashlib.sha256(f"{self.info.id}/{model.library_version}".encode()).hexdigest()[:10]
        )

    def _build_contexts(
        self,
        model: native.LoadedModel,
        projector: vision.Projector | None,
        grammars: Grammars,
    ) -> None:
        """The sequences, the shared-prefix context (where the load made one), the scheduler
        over both and the slots' context: what the owner thread steps."""
        shared = model.shared
        self._sequences = Sequences(
            model.vocab,
            ctx_per_slot=self.ctx_per_slot,
            counters=self._counters,
            fingerprint=self._fingerprint,
            settle=self._settle,
            shared_mem=shared.mem if shared is not None else None,
            grammars=grammars,
        )
        # The shared-prefix context (shared_context.py): its lines run in branches, the
        # sequences of a context of their own.
        self._shared: SharedPrefixContext | None = None
        if shared is not None:
            self._shared = SharedPrefixContext(
                shared,
                ctx_per_slot=self.ctx_per_slot,
                on_gpu=model.gpu_backend is not None,
                sequences=self._sequences,
                counters=self._counters,
                fail=self._fail_job,
            )
        self._scheduler: Scheduler[SharedRound] = Scheduler(
            model.n_seqs,  # batch lines take all but the online one (Scheduler.batch_seqs)
            prefix_cache=self.settings.prefix_cache,
            embed_tokens=self._embedder.batch_tokens,
            embed_seqs=EMBED_SEQS,
            shared=self._shared.blocks if self._shared is not None else None,
            branches=self._shared.branches if self._shared is not None else None,
        )
        self._context = SlotsContext(
            model,
            self._scheduler,
            self._sequences,
            self._counters,
            self._fail_job,
            images=self._images,
            projector=projector,
        )
        self._slots = self._context.slots
        branches = self._shared.branches if self._shared is not None else []
        self._all: list[Seq] = self._slots + branches  # every sequence of both contexts

    def start(self) -> None:
        self._thread.start()
        log.info(
            "engine ready: model=%s backend=%s slots=%d ctx/slot=%d kv=%s threads=%d",
            self.info.id,
            self.info.backend,
            self.n_slots,
            self.ctx_per_slot,
            self._native.kv_cache_type,
            self._native.threads,
        )

    # ----------------------------------------------------------------- the public contract

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
        model: str | None = None,
    ) -> Future[dict[str, Any]]:
        """The Engine contract's submit; `model`: the id the answer carries, where the pool
        routed the request to another id of this model (None: `info.id`)."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        job = Job(endpoint, body, Priority(priority), on_chunk, model or self.info.id)
        # Preparing reads the vocabulary, so it must not overlap close() freeing the model.
        with self._prepare_lock:
            if self._closing:
                job.future.set_exception(engine_closed())
                return job.future
            try:
                tasks = self._preparer.prepare(job, self._seq)
            except EngineError as exc:
                job.future.set_exception(exc)
                self._counters.count("failed")
                return job.future
            if job.image_chunks and self._images is not None:
                # Pinned until the job settles; queued for encoding unless already done.
                job.image_pins = self._images.pin(job.image_chunks, int(job.priority))
                job.image_chunks = []
        with self._cond:
            if self._closing:
                job.future.set_exception(engine_closed())
                return job.future
            self._jobs[job.future] = job
            for task in tasks:
                heapq.heappush(self._queue, task)
            self._cond.notify()
        return job.future

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int:
        """The prompt tokens a request would take, by this model's own chat template and
        tokenizer, without running it (a sheet's estimate). Raises EngineError for a
        request the engine would refuse."""
        job = Job(endpoint, body, Priority.ONLINE, None)
        with self._prepare_lock:
            if self._closing:
                raise engine_closed()
            self._preparer.prepare(job, itertools.count())
            free_images(job)
        return sum(len(p) for p in job.prompts)

    def image_form(self, model: Any) -> tuple[str, int]:
        """PNG and JPEG data URLs, any size: its projector scales them."""
        return ("png", 0)

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        with self._cond:
            job = self._jobs.pop(future, None)
            if job is None or job.future.done():
                return
            job.cancelled = True  # the owner thread drops its queued tasks and frees its slots
            self._cond.notify()
        if self._settle(job, error=RequestCancelled()):
            self._counters.count("cancelled")

    @property
    def images_encoded(self) -> int:
        """Image chunks encoded since the load (each distinct image once while cached)."""
        return self._images.encodes if self._images is not None else 0

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def stats(self) -> EngineStats:
        stats = self._counters.snapshot(
            active=sum(1 for s in self._all if s.busy), queued=len(self._queue)
        )
        stats.images_encoded = self.images_encoded
        return stats

    def close(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
        if self._thread.ident is not None:
            self._thread.join()  # its last act fails what was still pending
        else:
            self._fail_all(engine_closed())  # never started
        with self._prepare_lock:
            before = native.memory_in_use()
            self._embedder.close()
            if self._images is not None:
                self._images.close()
            self._context.free()
            if self._projector is not None:
                self._projector.free()
            self._native.free()
            # What the process gave back: the pool logs it beside what the load took.
            self.freed_bytes = max(0, before - native.memory_in_use())

    # ---------------------------------------------------------------------- the owner thread

    def _run(self) -> None:
        on_gpu = self._native.gpu_backend is not None  # None with no layer offloaded
        if effective(self.settings.engine_priority, on_gpu=on_gpu) == "low":
            # Before the first decode: llama.cpp's OpenMP workers inherit it (thread_priority.py).
            log.info("engine priority: %s", lower_this_thread())
        try:
            while True:
                with self._cond:
                    while not self._closing and not self._queue and not self._busy():
                        self._cond.wait()
                    if not self._busy():
                        self._gather()
                    if self._closing:
                        break
                    embeds = self._admit()
                if embeds:
                    self._embed(embeds)
                if self._busy() and not self._step():
                    # Nothing could run: the lines wait for their images' encodes.
                    with self._cond:
                        if not self._closing:
                            self._cond.wait(IMAGE_WAIT)
        except Exception:  # a broken context is not a request error: fail everything, loudly
            log.exception("engine thread crashed")
        finally:
            self._fail_all(engine_closed())

    def _gather(self) -> None:
        """An idle engine given batch lines waits while more keep coming, BATCH_GATHER_QUIET
        apart, BATCH_GATHER_MAX at most: a file's lines arrive in a burst, and the admission
        groups lines by the blocks they share only when it sees them together (the first
        line alone would compute its block in a slot, then the others again, here). Online
        requests never wait: they sort first, and the wait ends when one comes."""
        deadline = time.monotonic() + BATCH_GATHER_MAX
        seen = len(self._queue)
        while self._queue and self._queue[0].job.priority == Priority.BATCH:
            left = deadline - time.monotonic()
            if left <= 0 or self._closing:
                return
            self._cond.wait(min(BATCH_GATHER_QUIET, left))
            if len(self._queue) == seen:
                return
            seen = len(self._queue)

    def _busy(self) -> bool:
        """A sequence runs, or a block waits to be evaluated."""
        return self._context.busy or (self._shared is not None and self._shared.has_work)

    def _admit(self) -> list[Job]:
        """Drop withdrawn work, start the tasks that fit; returns the embedding jobs."""
        before = len(self._queue)
        self._queue = [t for t in self._queue if not t.job.cancelled]
        if len(self._queue) != before:
            heapq.heapify(self._queue)
        for slot in self._all:
            if slot.job is not None and slot.job.cancelled:
                self._sequences.release(slot)
        admission = self._scheduler.admit(self._queue, self._slots)
        if self._shared is not None:
            if admission.shared is not None:
                for task in self._shared.start(admission.shared):
                    heapq.heappush(self._queue, task)  # its block was lost: computed again
            self._report_shared()
        for task, group in admission.starts:
            self._context.start(task, group)
        return admission.embeds

    def _step(self) -> bool:
        """One llama_decode over every slot that has work, then sample and retire; then
        the same in the shared-prefix context, where its branches or blocks have work.
        Returns whether anything was decoded."""
        did = self._context.busy and self._context.step()
        if self._shared is None:
            return did
        online = any(s.job is not None and s.job.priority == Priority.ONLINE for s in self._slots)
        if self._shared.waits(online):
            return True  # an online request decodes: the shared context waits its turn
        if self._shared.has_work:
            budget = self._scheduler.prompt_budget(self._shared.branches, self.n_batch)
            did = self._shared.step(online, budget) or did
            self._report_shared()
        return did

    def _report_shared(self) -> None:
        """Tell the runner, through info.lane_sequences, to keep the shared context's branches
        fed while it has work, and only the slots otherwise: a node of a fleet that runs
        independent lines claims no more than its slots' worth (twice, as before)."""
        assert self._shared is not None
        branches = self._shared.n_branches if self._shared.has_work else 0
        if self.info.shared_branches != branches:
            self.info = dataclasses.replace(self.info, shared_branches=branches)

    def _embed(self, jobs: list[Job]) -> None:
        """Embed the inputs of several requests together (as few decodes as they fill)."""
        jobs = [j for j in jobs if not j.cancelled and not j.future.done()]
        if not jobs:
            return
        try:
            vectors = self._embedder.embed([p for job in jobs for p in job.prompts])
        except EngineError as exc:
            for job in jobs:
                self._fail_job(job, exc)
            return
        at = 0
        for job in jobs:
            mine, at = vectors[at : at + len(job.prompts)], at + len(job.prompts)
            tokens = sum(len(p) for p in job.prompts)
            self._counters.tokens(prompt=tokens)
            body = answers.embedding_list(
                mine, tokens, job.model, base64_out=job.body.get("encoding_format") == "base64"
            )
            if self._settle(job, result=body):
                self._counters.count("succeeded")

    # ----------------------------------------------------------------------- bookkeeping

    def _settle(
        self, job: Job, *, result: dict[str, Any] | None = None, error: BaseException | None = None
    ) -> bool:
        """Forget the job and resolve its future once (see base.resolve)."""
        with self._cond:
            self._jobs.pop(job.future, None)
            pins, job.image_pins = job.image_pins, []
        if pins and self._images is not None:
            self._images.release(pins)
        return resolve(job.future, result=result, error=error)

    def _fail_job(self, job: Job | None, error: EngineError) -> None:
        if job is None:
            return
        job.cancelled = True  # reuse the withdrawal path to free its slots and queued tasks
        for slot in self._all:
            if slot.job is job:
                self._sequences.release(slot)
        if self._settle(job, error=error):
            self._counters.count("failed")

    def _fail_all(self, error: EngineError) -> None:
        with self._cond:
            self._closing = True
            jobs = list(self._jobs.values())
            self._queue.clear()
        for slot in self._all:
            if slot.busy:
                self._sequences.release(slot)
        for job in jobs:
            if self._settle(job, error=error):
                self._counters.count("failed")


__all__ = ["LlamaEngine"]
