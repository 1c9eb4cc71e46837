"""The slots' context at work: a KV stream a slot, for requests that share little.

A started prompt lands in the slot the admission chose (slots.py) and begins from the
longest prefix some slot's KV holds (a stream copied, the rest dropped); siblings of a
request with several choices get the leader's prompt KV once it is evaluated. Each step
decodes the slots' image rows that are ready (vision.py, rows.py), then one token per generating
slot and prompt chunks up to the step's budget, in one llama_decode; the sampling is
sequences.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc

from app.engine.base import EngineError
from app.engine.counters import Counters
from app.engine.llama.binding import native, vision
from app.engine.llama.binding.rows import RowBatch
from app.engine.llama.contexts.sequences import Sequences, decode_failed, fill_rows
from app.engine.llama.contexts.shared import SharedRound
from app.engine.llama.contexts.slots import Scheduler, Seq
from app.engine.llama.jobs.jobs import Job, Task
from app.engine.llama.jobs.oai import media

log = logging.getLogger("batchyard.engine")

#: Fails a job: its sequences let go in both contexts, its future resolved (the engine's).
Fail = Callable[[Job | None, EngineError], None]


class SlotsContext:
    """The model's main llama.cpp context and its sequences: the `n_slots` slots batch lines
    take and the one kept for online requests (app/catalog/estimate.py's context_sequences)."""

    def __init__(
        self,
        model: native.LoadedModel,
        scheduler: Scheduler[SharedRound],
        sequences: Sequences,
        counters: Counters,
        fail: Fail,
        *,
        images: vision.ImageStore | None = None,
        projector: vision.Projector | None = None,
    ) -> None:
        self.ctx, self.mem, self.batch = model.ctx, model.mem, model.batch
        self.n_batch = model.n_batch
        self.slots = [Seq(i, model.ctx) for i in range(model.n_seqs)]
        self.scheduler = scheduler
        self.sequences = sequences
        self.counters = counters
        self.fail = fail
        # Slots whose stream copy llama.cpp has queued but not yet done (it happens at the
        # next decode); they are not a source for another copy until then.
        self.copy_pending: set[int] = set()
        # Encoded images (vision.py) and the batch their rows decode in.
        self.images = images
        self.projector = projector
        self.rows = RowBatch(projector.n_embd if projector is not None else 0)
        #: An M-RoPE image chunk's first id: its rows beyond the positions it takes.
        self.row_shift: dict[int, int] = {}

    @property
    def busy(self) -> bool:
        return any(s.busy for s in self.slots)

    def start(self, task: Task, group: list[Seq]) -> None:
        """Start `task`'s choices in `group`, the leader (first) with its prompt."""
        job = task.job
        prompt = job.prompts[task.prompt_index]
        leader = group[0]
        for slot, index in zip(group, task.choice_indices, strict=True):
            self.sequences.take(slot, task, index, None if slot is leader else leader)
        reused = self.reuse_prefix(leader, prompt)
        leader.pos = self.position(prompt, reused)
        leader.shift = reused - leader.pos
        leader.pending = prompt[reused:]
        job.cached_tokens += reused
        self.counters.tokens(prompt=len(prompt))

    def reuse_prefix(self, slot: Seq, prompt: list[int]) -> int:
        """Make `slot`'s KV hold the longest cached prefix of `prompt`; returns its length."""
        source, keep = self.scheduler.prefix_source(slot, prompt, self.slots, self.copy_pending)
        keep = media.whole_images(prompt, keep)  # an image's cells are kept whole or not at all
        if source is not None:
            # Separate KV streams only copy whole streams (llama.cpp queues the buffer copy
            # for the next decode); the tail past the shared prefix is dropped right after.
            # In one unified stream the copy tags the source's cells, so the slot's own
            # cells go first.
            lc.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            lc.llama_memory_seq_cp(self.mem, source.seq_id, slot.seq_id, -1, -1)
            slot.cached = list(source.cached)
            self.copy_pending.add(slot.seq_id)
        if len(slot.cached) > keep:
            lc.llama_memory_seq_rm(self.mem, slot.seq_id, self.position(slot.cached, keep), -1)
            del slot.cached[keep:]
        return keep

    def position(self, tokens: list[int], k: int) -> int:
        """The position after the first `k` of a sequence's `tokens` (k at a chunk's edge):
        k, less the rows of M-RoPE images beyond the positions they take (rows.py)."""
        if not self.row_shift:
            return k
        shift = self.row_shift
        return k - sum(shift.get(t, 0) for t in tokens[:k] if t < 0)

    def step(self) -> bool:
        """One llama_decode over every slot that has work, then sample. Slots whose next
        chunk is an image decode it first, each alone, within the step's prompt budget.
        Returns whether anything was decoded."""
        held = self.scheduler.held_back(self.slots)
        budget = self.scheduler.prompt_budget(self.slots, self.n_batch)
        did = False
        if self.images is not None:
            rows = self.decode_images(held, budget)
            budget, did = max(0, budget - rows), rows > 0
        # Each slot is a KV stream: forced tokens go in equal chunks (sequences.equal_ahead).
        n = fill_rows(self.slots, self.batch, 0, budget, held, streams=True)
        did = did or n > 0
        if n and self.decode(n):
            self.after_decode()
        return did

    def decode_images(self, held: set[int], budget: int) -> int:
        """Decode the next image chunk of the slots whose prompt has reached an encoded
        one, together in one llama_decode up to `budget` rows (the first always goes; an
        image of a non-causal projector goes alone); returns the rows decoded."""
        assert self.images is not None and self.projector is not None
        causal = not self.projector.non_causal
        taken: list[tuple[Seq, vision.Encoded]] = []
        rows = 0
        for slot in self.slots:
            job = slot.job
            if job is None or not slot.pending or slot.pending[0] >= 0 or slot.seq_id in held:
                continue
            encoded = self.images.take(job.images.get(slot.pending[0], ""))
            if encoded is None:
                continue  # still being encoded
            if encoded.error is not None:
                self.images.release([encoded.key])
                self.fail(job, encoded.error)
                continue
            if taken and (not causal or rows + encoded.n_tokens > budget):
                self.images.release([encoded.key])
                break
            taken.append((slot, encoded))
            rows += encoded.n_tokens
        if not taken:
            return 0
        parts = [(e.rows, s.pos, s.seq_id, e.layout) for s, e in taken if e.rows is not None]
        rc = self.rows.decode(self.ctx, parts, causal)
        self.images.release([e.key for _, e in taken])
        self.copy_pending.clear()  # the decode ran the stream copies llama.cpp queued
        for slot, encoded in taken:
            if rc != 0:
                lc.llama_memory_seq_rm(self.mem, slot.seq_id, slot.pos, -1)
                self.fail(slot.job, decode_failed(rc))
                continue
            n = encoded.n_tokens
            n_pos = encoded.layout.n_pos if encoded.layout is not None else n
            if n_pos != n:
                self.row_shift[slot.pending[0]] = n - n_pos
            slot.cached.extend(slot.pending[:n])
            slot.pending = slot.pending[n:]
            slot.pos += n_pos
            slot.shift += n - n_pos
        if rc != 0:
            log.error("llama_decode returned %d on image rows; failing their requests", rc)
        return rows

    def decode(self, n: int) -> bool:
        """llama_decode over the filled rows; on failure, fail their requests and say so."""
        self.batch.n_tokens = n
        rc = lc.llama_decode(self.ctx, self.batch)
        self.copy_pending.clear()
        if rc == 0:
            return True
        # Per-sequence contexts are sized so this cannot happen for admitted work; if it
        # does, fail the requests in this batch rather than the engine.
        log.error("llama_decode returned %d; failing the sequences of this step", rc)
        for slot in self.slots:
            if slot.busy and (slot.i_batch >= 0 or slot.generating):
                self.fail(slot.job, decode_failed(rc))
        # What the failed batch left in KV is unknown: free slots forget their caches.
        for slot in self.slots:
            if not slot.busy:
                lc.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
                slot.cached = []
        return False

    def after_decode(self) -> None:
        """Copy finished prompts to their sibling choices, then sample every row."""
        for slot in self.slots:
            if slot.i_batch < 0 or slot.job is None:
                continue
            for follower in slot.followers:
                # The prompt was evaluated once; its KV becomes the start of every sibling choice.
                lc.llama_memory_seq_rm(self.mem, follower.seq_id, -1, -1)
                lc.llama_memory_seq_cp(self.mem, slot.seq_id, follower.seq_id, -1, -1)
                follower.cached = list(slot.cached)
                self.copy_pending.add(follower.seq_id)
                follower.pos, follower.shift = slot.pos, slot.shift
                follower.i_batch = slot.i_batch
            slot.followers = []
        self.sequences.sample_rows(self.slots)

    def free(self) -> None:
        """The image rows' batch (the context itself goes with the model: native.py)."""
        self.rows.free()
