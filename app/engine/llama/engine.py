"""Continuous-batching inference over llama.cpp's low-level API; one thread owns the model.

Callers `submit()` an OpenAI request body from any thread and get a Future. The owner
thread keeps `n_slots` sequences in one llama context: every step it puts one token per
generating sequence plus prompt chunks of newly admitted requests into a single
llama_batch, calls llama_decode once, samples each sequence from its own row of logits,
frees the slots of sequences that ended and admits the next queued requests.

The rooms: native.py loads and wraps llama.cpp, prepare.py turns bodies into tasks,
slots.py holds the slots and the scheduling decisions, answers.py builds the OpenAI
bodies, embed.py the embeddings. This module is the loop that ties them together.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc

from app.config import AUTO_GPU_LAYERS, Settings
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
from app.engine.llama import native, vision
from app.engine.llama.embed import EMBED_SEQS, Embedder
from app.engine.llama.jobs import Choice, Job, Task
from app.engine.llama.oai import answers, media
from app.engine.llama.oai.chat_template import ChatTemplate
from app.engine.llama.prepare import Preparer, free_images
from app.engine.llama.sampler import build_sampler, free_sampler, top_logprobs_of
from app.engine.llama.shared import CPU_WAVE, SharedBlocks, SharedPlan
from app.engine.llama.slots import BATCH_PROMPT_TOKENS_PER_STEP, Scheduler, Slot
from app.engine.llama.thread_priority import effective, lower_this_thread
from app.wire.endpoints import ENDPOINTS

if TYPE_CHECKING:
    from app.catalog import Entry

log = logging.getLogger("batchyard.engine")

#: While an online request decodes, the shared-prefix context steps once in this many
#: seconds at most, with ONLINE_SHARED_PROMPT prompt tokens at most besides its decoding
#: lines. Any step of it costs 0.1-0.3 s on a CPU (every row attends to a long block, and
#: flash attention pads a micro-batch to tiles of 64 rows), 1-2.5 s with a full prefill.
#: A 16-token online answer beside a shared-block batch (bench/online_latency.py --shared,
#: median of 8, idle 0.06-0.09 s): a step every other slots' step with 512 prompt tokens,
#: 4.4 s; the same with 8 lines a step and 64 tokens, 2.0 s; a step every 0.25 s with 64
#: tokens, 1.2 s; every 0.5 s with 64 tokens, 0.63 s (kept: beside a plain batch it is
#: 0.54 s); every 0.25 s with none, 0.58 s, but a steady run of online requests would then
#: stop the batch's prefill.
ONLINE_SHARED_GAP = 0.5
ONLINE_SHARED_PROMPT = 64
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
        self._ctx, self._mem, self._batch = model.ctx, model.mem, model.batch
        self.vocab = model.vocab
        self.n_vocab = model.vocab.n_vocab
        self.n_slots, self.n_batch = model.n_slots, model.n_batch
        self.ctx_per_slot = model.ctx_per_slot
        self.chat_template = ChatTemplate(
            chat_template or model.chat_template,
            model.vocab.token_text(model.vocab.bos),
            model.vocab.token_text(model.vocab.eos),
        )
        self.info = model.model_info(
            has_chat_template=self.chat_template.has_template,
            n_gpu_layers=settings.n_gpu_layers,
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
        #: Bytes the load took (the process's resident set before and after), and seconds.
        self.measured_bytes: int | None = None
        self.load_seconds: float | None = None
        self.freed_bytes: int | None = None
        self._fingerprint = (
            "fp_"
            + hashlib.sha256(f"{self.info.id}/{model.library_version}".encode()).hexdigest()[:10]
        )
        self._preparer = Preparer(
            model.vocab,
            self.chat_template,
            ctx_per_slot=self.ctx_per_slot,
            n_slots=self.n_slots,
            embedding_dim=model.n_embd,
            vision=projector,
        )
        self._embedder = Embedder(
            model.model, ctx_size=self.ctx_per_slot, threads=model.threads, dim=model.n_embd
        )
        # The shared-prefix context (shared.py): its lines are sequences of their own context.
        self._shared = model.shared
        self._branches: list[Slot] = []
        self._blocks: SharedBlocks | None = None
        if self._shared is not None:
            self._branches = [Slot(i, self._shared.ctx) for i in range(self._shared.n_branches)]
            self._blocks = SharedBlocks(
                n_branches=self._shared.n_branches,
                n_blocks=self._shared.n_blocks,
                n_cells=self._shared.n_cells,
                ctx_per_branch=self.ctx_per_slot,
                max_wave=0 if model.gpu_backend else CPU_WAVE,
            )
        self._scheduler = Scheduler(
            self.n_slots,
            prefix_cache=settings.prefix_cache,
            embed_tokens=self._embedder.batch_tokens,
            embed_seqs=EMBED_SEQS,
            shared=self._blocks,
            lines=self._branches,
        )

        self._cond = threading.Condition()
        self._prepare_lock = threading.Lock()
        self._queue: list[Task] = []
        self._seq = itertools.count()
        self._jobs: dict[Future[dict[str, Any]], Job] = {}
        self._closing = False
        self._slots = [Slot(i, model.ctx) for i in range(self.n_slots)]
        self._all = self._slots + self._branches  # every sequence of both contexts
        self._shared_last = 0.0  # when the shared context's last step ended
        # Slots whose stream copy llama.cpp has queued but not yet done (it happens at the
        # next decode); they are not a source for another copy until then.
        self._copy_pending: set[int] = set()
        self._counters = Counters()
        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)
        # Encoded images, and the thread that encodes them beside the decoding (vision.py).
        self._images: vision.ImageStore | None = None
        self._rows = vision.RowBatch(projector.n_embd if projector is not None else 0)
        if projector is not None:
            self._images = vision.ImageStore(projector, on_ready=self._wake)

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
    ) -> Future[dict[str, Any]]:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        job = Job(endpoint, body, Priority(priority), on_chunk)
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
            self._rows.free()
            if self._projector is not None:
                self._projector.free()
            self._native.free()
            # What the close gave back, against what the load took: the pool checks that
            # a model's memory was freed rather than assume it.
            self.freed_bytes = max(0, before - native.memory_in_use())

    # ---------------------------------------------------------------------- the owner thread

    def _run(self) -> None:
        on_gpu = self._native.gpu_backend is not None and self.settings.n_gpu_layers != 0
        if effective(self.settings.engine_priority, on_gpu=on_gpu) == "low":
            # Before the first decode: llama.cpp's OpenMP workers inherit it (priority.py).
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
        return any(s.busy for s in self._slots) or self._shared_work()

    def _shared_work(self) -> bool:
        """A line of the shared context runs, or one of its blocks waits to be evaluated."""
        blocks = self._blocks.blocks if self._blocks is not None else []
        return any(s.busy for s in self._branches) or any(b.pending for b in blocks)

    def _admit(self) -> list[Job]:
        """Drop withdrawn work, start the tasks that fit; returns the embedding jobs."""
        before = len(self._queue)
        self._queue = [t for t in self._queue if not t.job.cancelled]
        if len(self._queue) != before:
            heapq.heapify(self._queue)
        for slot in self._all:
            if slot.job is not None and slot.job.cancelled:
                self._release(slot)
        admission = self._scheduler.admit(self._queue, self._slots)
        if admission.shared is not None:
            self._start_shared(admission.shared)
        if self._shared is not None:
            self._report_shared()
        for task, group in admission.starts:
            self._start(task, group)
        return admission.embeds

    def _take(self, slot: Slot, task: Task, index: int, leader: Slot | None) -> None:
        """Start choice `index` of `task` in `slot`, with its sampler."""
        job = task.job
        prompt_len = len(job.prompts[task.prompt_index])
        slot.take(job, job.choices[index], prompt_len, leader, ctx_per_slot=self.ctx_per_slot)
        # Plain greedy takes the argmax itself (_sample) and needs no sampler chain.
        if not job.params.plain_greedy:
            slot.sampler = build_sampler(
                job.params,
                self.vocab.ptr,
                self.n_vocab,
                job.params.choice_seed(index),
                self.ctx_per_slot,
            )

    def _start(self, task: Task, group: list[Slot]) -> None:
        job = task.job
        prompt = job.prompts[task.prompt_index]
        leader = group[0]
        for slot, index in zip(group, task.choice_indices, strict=True):
            self._take(slot, task, index, None if slot is leader else leader)
        reused = self._reuse_prefix(leader, prompt)
        leader.pos = reused
        leader.pending = prompt[reused:]
        job.cached_tokens += reused
        self._counters.tokens(prompt=len(prompt))

    def _start_shared(self, plan: SharedPlan) -> None:
        """Carry out the shared context's round: start new blocks (forked from a block they
        extend), park idle blocks in host memory and drop those past KEEP_IDLE, put parked
        blocks back, and fork each started line from its block's cells."""
        assert self._shared is not None and self._blocks is not None
        shared, mem = self._shared, self._shared.mem
        for block in plan.new_blocks:
            lc.llama_memory_seq_rm(mem, block.seq_id, -1, -1)
            if block.source is not None:
                lc.llama_memory_seq_cp(mem, block.source.seq_id, block.seq_id, 0, block.pos)
                block.source = None
        # Parked blocks leave the stream after the new blocks' forks from them; their
        # sequence ids stay unused until the next round.
        dropped = {id(b) for b in plan.dropped}
        for block, seq_id in plan.parked:
            if id(block) not in dropped:
                block.state = shared.save(seq_id)
            lc.llama_memory_seq_rm(mem, seq_id, -1, -1)
        for block in plan.dropped:
            block.state = None
        lost: set[int] = set()
        for block in plan.restored:
            lc.llama_memory_seq_rm(mem, block.seq_id, -1, -1)
            if not shared.restore(block.state, block.seq_id):
                # The planner restores only into a stream its other blocks have just left,
                # so this is not expected: the block is computed again when its lines
                # come back to the queue.
                log.error("a parked block did not fit back in the shared-prefix context")
                lc.llama_memory_seq_rm(mem, block.seq_id, -1, -1)
                self._blocks.forget(block)
                lost.add(id(block))
            block.state = None
        for start in plan.starts:
            task, branch = start.task, start.branch
            if id(start.block) in lost:
                heapq.heappush(self._queue, task)
                continue
            prompt = task.job.prompts[task.prompt_index]
            self._take(branch, task, task.choice_indices[0], None)
            # One stream: the fork tags the block's cells with the branch's sequence id.
            lc.llama_memory_seq_cp(mem, start.block.seq_id, branch.seq_id, 0, start.forked)
            branch.block, branch.reserved = start.block, start.reserved
            branch.pos = start.forked
            branch.pending = prompt[start.forked :]
            task.job.cached_tokens += start.forked
            self._counters.tokens(prompt=len(prompt))

    def _reuse_prefix(self, slot: Slot, prompt: list[int]) -> int:
        """Make `slot`'s KV hold the longest cached prefix of `prompt`; returns its length."""
        source, keep = self._scheduler.prefix_source(slot, prompt, self._slots, self._copy_pending)
        keep = media.whole_images(prompt, keep)  # an image's cells are kept whole or not at all
        if source is not None:
            # Separate KV streams only copy whole streams (llama.cpp queues the buffer copy
            # for the next decode); the tail past the shared prefix is dropped right after.
            # In one unified stream the copy tags the source's cells, so the slot's own
            # cells go first.
            lc.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
            lc.llama_memory_seq_cp(self._mem, source.seq_id, slot.seq_id, -1, -1)
            slot.cached = list(source.cached)
            self._copy_pending.add(slot.seq_id)
        if len(slot.cached) > keep:
            lc.llama_memory_seq_rm(self._mem, slot.seq_id, keep, -1)
            del slot.cached[keep:]
        return keep

    def _step(self) -> bool:
        """One llama_decode over every sequence that has work, then sample and retire; then
        the same in the shared-prefix context, where its lines or blocks have work. Slots
        whose next chunk is an image decode it first, each alone, within the step's prompt
        budget. Returns whether anything was decoded."""
        did = False
        if any(s.busy for s in self._slots):
            held = self._scheduler.held_back(self._slots)
            budget = self._scheduler.prompt_budget(self._slots, self.n_batch)
            if self._images is not None:
                rows = self._decode_images(held, budget)
                budget, did = max(0, budget - rows), rows > 0
            n = self._fill_batch(self._slots, self._batch, 0, budget, held)
            did = did or n > 0
            if n and self._decode(n):
                self._after_decode(self._slots)
        online = any(s.job is not None and s.job.priority == Priority.ONLINE for s in self._slots)
        if online and time.monotonic() - self._shared_last < ONLINE_SHARED_GAP:
            return True  # an online request decodes: the shared context waits its turn
        if self._shared_work():
            n = self._fill_shared(online)
            did = did or n > 0
            if n and self._decode_shared(n):
                self._after_decode(self._branches)
            self._shared_last = time.monotonic()
            self._report_shared()
        return did

    def _decode_images(self, held: set[int], budget: int) -> int:
        """Decode the next image chunk of the slots whose prompt has reached an encoded
        one, together in one llama_decode up to `budget` rows (the first always goes; an
        image of a non-causal projector goes alone); returns the rows decoded."""
        assert self._images is not None and self._projector is not None
        causal = not self._projector.non_causal
        taken: list[tuple[Slot, vision.Encoded]] = []
        rows = 0
        for slot in self._slots:
            job = slot.job
            if job is None or not slot.pending or slot.pending[0] >= 0 or slot.seq_id in held:
                continue
            entry = self._images.take(job.images.get(slot.pending[0], ""))
            if entry is None:
                continue  # still being encoded
            if entry.error is not None:
                self._images.release([entry.key])
                self._fail_job(job, entry.error)
                continue
            if taken and (not causal or rows + entry.n_tokens > budget):
                self._images.release([entry.key])
                break
            taken.append((slot, entry))
            rows += entry.n_tokens
        if not taken:
            return 0
        parts = [(e.rows, s.pos, s.seq_id) for s, e in taken if e.rows is not None]
        rc = self._rows.decode(self._ctx, parts, causal)
        self._images.release([e.key for _, e in taken])
        self._copy_pending.clear()  # the decode ran the stream copies llama.cpp queued
        for slot, entry in taken:
            if rc != 0:
                lc.llama_memory_seq_rm(self._mem, slot.seq_id, slot.pos, -1)
                self._fail_job(slot.job, decode_failed(rc))
                continue
            n = entry.n_tokens
            slot.cached.extend(slot.pending[:n])
            slot.pending = slot.pending[n:]
            slot.pos += n
        if rc != 0:
            log.error("llama_decode returned %d on image rows; failing their requests", rc)
        return rows

    def _report_shared(self) -> None:
        """Tell the runner, through info.lane_slots, to keep the shared context's lines fed
        while it has work, and only the slots otherwise: a node of a fleet that runs
        independent lines claims no more than its slots' worth (twice, as before)."""
        assert self._shared is not None
        branches = self._shared.n_branches if self._shared_work() else 0
        if self.info.shared_branches != branches:
            self.info = dataclasses.replace(self.info, shared_branches=branches)

    def _fill_shared(self, online: bool) -> int:
        """The shared context's rows: the blocks' pending tokens first (their lines wait for
        them), then its lines as in the main context; returns the count. `online`: an online
        request decodes in the main context, and waits for this step too."""
        assert self._shared is not None and self._blocks is not None
        batch, add = self._shared.batch, native.batch_add
        # Its lines are batch lines: the budget is a batch step's, or the online turn's.
        budget = self._scheduler.prompt_budget(self._branches, self.n_batch)
        if online:
            budget = min(budget, ONLINE_SHARED_PROMPT)
        n = 0
        for block in self._blocks.blocks:
            if block.pending and budget > 0:
                take = min(len(block.pending), budget)
                chunk, block.pending = block.pending[:take], block.pending[take:]
                for token in chunk:
                    n = add(batch, n, token, block.pos, block.seq_id, False)
                    block.pos += 1
                budget -= take
        # Each block's lines in a run: a tile of 64 query rows then spans few blocks, and
        # flash attention skips the tiles of cells no row of it may see (the other blocks).
        lines = sorted(self._branches, key=lambda s: (s.block.seq_id if s.block else -1, s.seq_id))
        return self._fill_batch(lines, batch, n, budget, set())

    def _fill_batch(
        self, slots: list[Slot], batch: Any, n: int, budget: int, held: set[int]
    ) -> int:
        """Rows from row `n` on: a token per generating slot, then prompt chunks up to
        `budget` tokens; returns the count."""
        add = native.batch_add
        # Sequences go in seq_id order: llama.cpp splits a multi-stream batch into ubatches of
        # consecutive sequence ids, so order keeps a step to as few ubatches as possible.
        for slot in slots:
            slot.i_batch = -1
            if slot.seq_id in held:
                continue  # a batch line sits this step out; its next token waits in slot.token
            if slot.generating:
                n = add(batch, n, slot.token, slot.pos, slot.seq_id, True)
                slot.cached.append(slot.token)
                slot.pos += 1
                slot.i_batch = n - 1
            elif slot.pending and budget > 0:
                take = min(len(slot.pending), budget)
                if slot.job is not None and slot.job.images:
                    take = media.text_run(slot.pending, take)
                    if not take:
                        continue  # its next chunk is an image (_decode_image)
                chunk, slot.pending = slot.pending[:take], slot.pending[take:]
                for j, token in enumerate(chunk):
                    last = not slot.pending and j == take - 1
                    n = add(batch, n, token, slot.pos, slot.seq_id, last)
                    slot.pos += 1
                slot.cached.extend(chunk)
                budget -= take
                if not slot.pending:
                    slot.i_batch = n - 1
        return n

    def _decode(self, n: int) -> bool:
        """llama_decode over the filled rows; on failure, fail their requests and say so."""
        self._batch.n_tokens = n
        rc = lc.llama_decode(self._ctx, self._batch)
        self._copy_pending.clear()
        if rc == 0:
            return True
        # Per-sequence contexts are sized so this cannot happen for admitted work; if it
        # does, fail the requests in this batch rather than the engine.
        log.error("llama_decode returned %d; failing the sequences of this step", rc)
        for slot in self._slots:
            if slot.busy and (slot.i_batch >= 0 or slot.generating):
                self._fail_job(slot.job, decode_failed(rc))
        # What the failed batch left in KV is unknown: free slots forget their caches.
        for slot in self._slots:
            if not slot.busy:
                lc.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
                slot.cached = []
        return False

    def _decode_shared(self, n: int) -> bool:
        """llama_decode in the shared context; on failure, fail its lines and forget its
        blocks (what the cells hold is unknown then)."""
        assert self._shared is not None and self._blocks is not None
        self._shared.batch.n_tokens = n
        rc = lc.llama_decode(self._shared.ctx, self._shared.batch)
        if rc == 0:
            return True
        log.error("llama_decode returned %d in the shared-prefix context; failing its lines", rc)
        for line in self._branches:
            if line.busy:
                self._fail_job(line.job, decode_failed(rc))
        self._blocks.reset()
        lc.llama_memory_clear(self._shared.mem, True)
        return False

    def _after_decode(self, slots: list[Slot]) -> None:
        """Copy finished prompts to their sibling choices, sample every row, count the rate."""
        for slot in slots:
            if slot.i_batch < 0 or slot.job is None:
                continue
            for follower in slot.followers:
                # The prompt was evaluated once; its KV becomes the start of every sibling choice.
                lc.llama_memory_seq_rm(self._mem, follower.seq_id, -1, -1)
                lc.llama_memory_seq_cp(self._mem, slot.seq_id, follower.seq_id, -1, -1)
                follower.cached = list(slot.cached)
                self._copy_pending.add(follower.seq_id)
                follower.pos = slot.pos
                follower.i_batch = slot.i_batch
            slot.followers = []
        sampled = 0
        for slot in slots:
            if slot.i_batch >= 0 and slot.job is not None:
                self._sample(slot)
                sampled += 1
        self._counters.tokens(completion=sampled)

    def _sample(self, slot: Slot) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        if job.params.plain_greedy:
            # The argmax of the row, as llama.cpp's greedy sampler picks it (first of equals),
            # without building its candidate array over the whole vocabulary.
            token = int(native.logits_row(slot.ctx, slot.i_batch, self.n_vocab).argmax())
        else:
            token = lc.llama_sampler_sample(slot.sampler, slot.ctx, slot.i_batch)
        if self.vocab.is_eog(token):
            self._finish(slot, "stop")
            return
        choice.completion_tokens += 1
        piece = self.vocab.piece(token)
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
            slot.generate(token)

    def _record_logprob(self, slot: Slot, token: int, piece: bytes) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        logp, top = top_logprobs_of(
            lc.llama_get_logits_ith(slot.ctx, slot.i_batch), self.n_vocab, job.params.top_logprobs
        )
        alternatives = [(self.vocab.piece(t), float(logp[t])) for t in top]
        choice.logprobs.append(answers.token_logprob(piece, float(logp[token]), alternatives))

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
        if slot.block is not None:
            # A shared-context line: its own cells go at once; its block's stay for others.
            assert self._shared is not None
            lc.llama_memory_seq_rm(self._shared.mem, slot.seq_id, -1, -1)
            slot.block.users -= 1
            slot.cached = []
        # The KV stays, and slot.cached says what it holds, for a later prompt to reuse.
        slot.clear()

    def _complete(self, job: Job) -> None:
        model, fp = self.info.id, self._fingerprint
        if job.on_chunk and job.include_usage:
            self._call_chunk(job, answers.usage_chunk(job, model, fp))
        if self._settle(job, result=answers.completion(job, model, fp)):
            self._counters.count("succeeded")

    def _emit(self, job: Job, choice: Choice, text: str | None) -> None:
        """Stream one delta (text) or the closing chunk (None) of a choice."""
        if job.on_chunk is None:
            return
        for chunk in answers.choice_chunks(job, choice, text, self.info.id, self._fingerprint):
            self._call_chunk(job, chunk)
        choice.started = True

    def _call_chunk(self, job: Job, chunk: dict[str, Any]) -> None:
        assert job.on_chunk is not None
        try:
            job.on_chunk(chunk)
        except Exception:  # a broken stream consumer must not stop the other sequences
            log.exception("on_chunk callback failed for %s", job.id)

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
                mine, tokens, self.info.id, base64_out=job.body.get("encoding_format") == "base64"
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
                self._release(slot)
        if self._settle(job, error=error):
            self._counters.count("failed")

    def _fail_all(self, error: EngineError) -> None:
        with self._cond:
            self._closing = True
            jobs = list(self._jobs.values())
            self._queue.clear()
        for slot in self._all:
            if slot.busy:
                self._release(slot)
        for job in jobs:
            if self._settle(job, error=error):
                self._counters.count("failed")


def decode_failed(rc: int) -> EngineError:
    """The error of a request whose llama_decode failed."""
    return EngineError(
        f"llama_decode failed ({rc}).", status_code=500, code="decode_failed", type="server_error"
    )


def load_engine(
    settings: Settings, entry: Entry | None = None, *, projector: Path | None = None
) -> LlamaEngine:
    """Load the configured model (or a catalog entry with its load profile) and start its
    owner thread. The engine says what the load took: `measured_bytes`, `load_seconds`.

    A multimodal projector (`projector`, or the entry's) loads with the model, and the
    engine then takes images in chat and responses bodies (`info.takes_images`)."""
    if projector is None and entry is not None:
        projector = getattr(entry, "projector", None)
    if entry is not None:
        settings = entry_settings(settings, entry)
    if settings.n_gpu_layers == AUTO_GPU_LAYERS:
        # Without the pool's estimate of each layer (an engine loaded alone): every layer
        # on a GPU there is one, none without.
        on_gpu = lc.llama_supports_gpu_offload() and native.gpu_backend_name() is not None
        settings = dataclasses.replace(settings, n_gpu_layers=-1 if on_gpu else 0)
    before, t = native.memory_in_use(), time.monotonic()
    model = native.load(settings, prompt_tokens_per_step=BATCH_PROMPT_TOKENS_PER_STEP)
    eyes, eyes_bytes, eyes_error = None, None, None
    if projector is not None:
        at = native.memory_in_use()
        try:
            on_gpu = settings.n_gpu_layers != 0 and model.gpu_backend is not None
            eyes = vision.Projector(
                Path(projector), model.model, threads=model.threads, use_gpu=on_gpu
            )
        except RuntimeError as exc:
            # The text half still works: the model loads without images, and an image
            # line is told why.
            log.warning("model %s loads without its projector: %s", settings.model, exc)
            eyes_error = str(exc)
        eyes_bytes = max(0, native.memory_in_use() - at)
    engine = LlamaEngine(
        settings,
        model,
        model_id=entry.id if entry is not None else None,
        chat_template=entry.profile.chat_template if entry is not None else None,
        projector=eyes,
        projector_error=eyes_error,
    )
    engine.projector_bytes = eyes_bytes
    engine.load_seconds = time.monotonic() - t
    engine.measured_bytes = max(0, native.memory_in_use() - before)
    engine.start()
    return engine


def entry_settings(settings: Settings, entry: Entry) -> Settings:
    """The server's settings with the entry's file and load profile in place of its own."""
    p = entry.profile
    return dataclasses.replace(
        settings,
        model=str(entry.path),
        ctx_size=p.ctx_size,
        parallel=p.parallel,
        n_gpu_layers=p.n_gpu_layers,
        kv_cache_type=p.kv_cache_type,
        shared_prefix_cells=p.shared_prefix_cells,
    )


__all__ = ["LlamaEngine", "entry_settings", "load_engine"]
