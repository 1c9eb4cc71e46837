"""The shared-prefix context at work: one unified f16 KV stream where a block that batch
lines share is evaluated once, and each line runs in a branch forked from its cells.

shared.py decides, without llama.cpp, which lines run here and which blocks open, park,
come back or go; this module carries its rounds out on the context (native.SharedContext)
and takes the context's turn beside the slots' context: its blocks' pending tokens, then its
branches' rows, in one llama_decode. While an online request decodes in the slots' context,
the turn comes once in ONLINE_SHARED_GAP at most, with ONLINE_SHARED_PROMPT prompt rows at
most.
"""

from __future__ import annotations

import logging
import time

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc

from app.engine.counters import Counters
from app.engine.llama.binding import native
from app.engine.llama.contexts.sequences import Sequences, decode_failed, fill_rows
from app.engine.llama.contexts.shared import CPU_WAVE, SharedBlocks, SharedRound
from app.engine.llama.contexts.slots import Seq
from app.engine.llama.contexts.slots_context import Fail
from app.engine.llama.jobs.jobs import Task

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


class SharedPrefixContext:
    """The shared-prefix context, its blocks (shared.py) and its branches."""

    def __init__(
        self,
        context: native.SharedContext,
        *,
        ctx_per_slot: int,
        on_gpu: bool,
        sequences: Sequences,
        counters: Counters,
        fail: Fail,
    ) -> None:
        self.context = context
        #: The context's sequences 0..n_branches-1, one batch line each.
        self.branches = [Seq(i, context.ctx) for i in range(context.n_branches)]
        self.blocks = SharedBlocks(
            n_branches=context.n_branches,
            n_blocks=context.n_blocks,
            n_cells=context.n_cells,
            ctx_per_branch=ctx_per_slot,
            max_wave=0 if on_gpu else CPU_WAVE,
        )
        self.sequences = sequences
        self.counters = counters
        self.fail = fail
        self.last_turn = 0.0  # when the context's last step ended

    @property
    def has_work(self) -> bool:
        """A branch runs, or a block waits to be evaluated."""
        return any(s.busy for s in self.branches) or any(b.pending for b in self.blocks.blocks)

    @property
    def n_branches(self) -> int:
        return self.context.n_branches

    def start(self, plan: SharedRound) -> list[Task]:
        """Carry out the admission's round: start new blocks (forked from a block they
        extend), park idle blocks in host memory and drop those past KEEP_IDLE, put parked
        blocks back, and fork each started line's branch from its block's cells. Returns
        the tasks whose block was lost on the way back: they go back to the queue."""
        shared, mem = self.context, self.context.mem
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
                self.blocks.forget(block)
                lost.add(id(block))
            block.state = None
        requeue: list[Task] = []
        for start in plan.starts:
            task, branch = start.task, start.branch
            if id(start.block) in lost:
                requeue.append(task)
                continue
            prompt = task.job.prompts[task.prompt_index]
            self.sequences.take(branch, task, task.choice_indices[0], None)
            # One stream: the fork tags the block's cells with the branch's sequence id.
            lc.llama_memory_seq_cp(mem, start.block.seq_id, branch.seq_id, 0, start.forked)
            branch.block, branch.reserved = start.block, start.reserved
            branch.pos = start.forked
            branch.pending = prompt[start.forked :]
            task.job.cached_tokens += start.forked
            self.counters.tokens(prompt=len(prompt))
        return requeue

    def waits(self, online: bool) -> bool:
        """Whether the context sits this step out: an online request decodes in the slots'
        context, and its last turn was less than ONLINE_SHARED_GAP ago."""
        return online and time.monotonic() - self.last_turn < ONLINE_SHARED_GAP

    def step(self, online: bool, budget: int) -> bool:
        """The context's turn: its rows in one llama_decode, then sample; `budget`: the
        prompt tokens a batch step may take (Scheduler.prompt_budget of its branches).
        Returns whether anything was decoded."""
        n = self.fill(online, budget)
        if n and self.decode(n):
            self.sequences.sample_rows(self.branches)
        self.last_turn = time.monotonic()
        return n > 0

    def fill(self, online: bool, budget: int) -> int:
        """The context's rows: the blocks' pending tokens first (their lines wait for them),
        then its branches as in the slots' context; returns the count. `online`: an online
        request decodes in the slots' context, and waits for this step too."""
        batch, add = self.context.batch, native.batch_add
        # Its lines are batch lines: the budget is a batch step's, or the online turn's.
        if online:
            budget = min(budget, ONLINE_SHARED_PROMPT)
        n = 0
        for block in self.blocks.blocks:
            if block.pending and budget > 0:
                take = min(len(block.pending), budget)
                chunk, block.pending = block.pending[:take], block.pending[take:]
                for token in chunk:
                    n = add(batch, n, token, block.pos, block.seq_id, False)
                    block.pos += 1
                budget -= take
        # Each block's branches in a run: a tile of 64 query rows then spans few blocks, and
        # flash attention skips the tiles of cells no row of it may see (the other blocks).
        branches = sorted(
            self.branches, key=lambda s: (s.block.seq_id if s.block else -1, s.seq_id)
        )
        return fill_rows(branches, batch, n, budget, set())

    def decode(self, n: int) -> bool:
        """llama_decode in the context; on failure, fail its branches' lines and forget its
        blocks (what the cells hold is unknown then)."""
        self.context.batch.n_tokens = n
        rc = lc.llama_decode(self.context.ctx, self.context.batch)
        if rc == 0:
            return True
        log.error("llama_decode returned %d in the shared-prefix context; failing its lines", rc)
        for branch in self.branches:
            if branch.busy:
                self.fail(branch.job, decode_failed(rc))
        self.blocks.reset()
        lc.llama_memory_clear(self.context.mem, True)
        return False
