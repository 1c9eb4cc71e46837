"""The shared-prefix context: batch lines that share a long block, in one unified KV stream.

The main context gives each slot a KV stream of its own. That keeps a line's attention to its
own cells, but a line that reuses a block must copy the block's whole stream, a wave is as wide
as the slots, and attention over the block runs a row at a time (the CPU's flash attention has
no tiled path for q8_0 K/V, nor for fewer than 64 query rows of one stream).

Here the block is evaluated once into a sequence of its own (a `Block`); a line forks from it
by tagging the block's cells with its own sequence id (llama_memory_seq_cp inside one stream
copies nothing), so a wave holds as many lines as the cells allow, up to llama.cpp's sequence
limit; and with f16 K/V and 64 or more query rows a micro-batch, the CPU's flash attention
multiplies tiles of the block at once, and skips the tiles no row of the tile may see.
Independent lines stay in the main context: in one stream each row would scan every other
line's cells (bench/README.md, issue 33).

This module decides, without llama.cpp, which queued batch lines run here, which blocks to
evaluate and which to drop; shared_context.py carries it out on the context.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from app.engine.base import Priority
from app.engine.llama.contexts.slots import PREFIX_CHUNK, Seq, chunk_keys, common_prefix
from app.engine.llama.jobs.block import Block
from app.engine.llama.jobs.jobs import Task
from app.wire.endpoints import EMBEDDINGS

#: A line runs here when its prompt shares at least this many tokens with a block, or with
#: another line waiting or running: below it, a short shared system prompt, the main
#: context's per-line streams are as fast (its copies cost little, attention is short).
MIN_BLOCK_TOKENS = 128
#: Idle blocks kept parked (the most recently used first): a block no line uses leaves the
#: stream when another block opens, its cells saved to host memory, and comes back in
#: milliseconds when lines for it come again (a later batch, or the runner's next claim).
#: Left in the stream, an idle block's cells cost every query row a look at their mask:
#: shared4 engine directly, each later block's wave took 9 to 22% longer with earlier
#: blocks in the stream (n_kv up to 4,352 against 2,304).
KEEP_IDLE = 3
#: Lines running at once on a CPU: one tile of the CPU's flash attention (64 query rows) a
#: decode step. A wider wave widens every row's look at the mask by its cells: engine
#: directly, shared 7.5 s with waves of 64, 8.8 s with 96, 8.1 s with 128; shared4 18.1,
#: 19.3 and 19.1 s. A GPU takes every line it can hold.
CPU_WAVE = 64
#: Cells kept free of reservations: llama.cpp places a micro-batch only where it fits whole.
CELL_MARGIN = 512


@dataclass
class Start:
    """A line that forks from a block, in a branch (a sequence of this context): `forked`
    tokens come from the block's cells, `reserved` cells are its own (the rest of its
    prompt and its longest answer)."""

    task: Task
    branch: Seq
    block: Block
    forked: int
    reserved: int


@dataclass
class SharedRound:
    """One admission round's decisions for the shared context."""

    starts: list[Start] = field(default_factory=list)
    new_blocks: list[Block] = field(default_factory=list)
    #: Blocks to save and take out of the stream (after the new blocks' forks from them),
    #: with the sequence id their cells have now.
    parked: list[tuple[Block, int]] = field(default_factory=list)
    #: Parked blocks to put back, under their new seq_id, before the lines fork.
    restored: list[Block] = field(default_factory=list)
    dropped: list[Block] = field(default_factory=list)
    #: Lines that belong here and wait for a block or for cells; the main context leaves them.
    held: set[int] = field(default_factory=set)  # id() of their tasks


def _prompt(task: Task) -> list[int]:
    return task.job.prompts[task.prompt_index]


def _keys(task: Task) -> list[int]:
    if task.prefix_keys is None:
        task.prefix_keys = chunk_keys(_prompt(task))
    return task.prefix_keys


def fits_here(task: Task) -> bool:
    """A batch line with one choice: what the shared context runs."""
    job = task.job
    return (
        job.priority == Priority.BATCH
        and job.endpoint != EMBEDDINGS
        and len(task.choice_indices) == 1
        and not job.cancelled
        and not job.images  # an image's rows decode in the slots' context (vision.py)
    )


class SharedBlocks:
    """The blocks of the shared context and the admission of lines into it."""

    def __init__(
        self,
        *,
        n_branches: int,
        n_blocks: int,
        n_cells: int,
        ctx_per_branch: int,
        max_wave: int = 0,
    ) -> None:
        self.n_branches = n_branches
        self.max_wave = max_wave or n_branches  # lines running at once
        self.n_cells = n_cells
        self.ctx_per_branch = ctx_per_branch
        self.blocks: list[Block] = []
        # Lines are sequences 0..n_branches-1; blocks take the ids above them.
        self._free_ids = list(range(n_branches, n_branches + n_blocks))
        self._parked_ids: list[int] = []  # free again from the next round on
        self._round = 0
        self._version = 0  # changes whenever a block comes or goes (Task.shared_match)
        self._free: list[Seq] = []  # this round's free branches
        self._running = 0  # lines running at the round's start
        self._reserved = 0  # cells they may take
        self._taken = 0  # cells reserved this round

    def cells_in_use(self, branches: list[Seq]) -> int:
        """Cells the blocks hold and the running branches may take (an upper bound)."""
        return self._block_cells() + sum(s.reserved for s in branches if s.busy)

    def _block_cells(self) -> int:
        return sum(len(b.tokens) for b in self.blocks if not b.parked)

    def reserve(self, task: Task, forked: int) -> int:
        """Cells a line takes beyond its block: its prompt's rest and its longest answer."""
        prompt = len(_prompt(task))
        cells_left = self.ctx_per_branch - prompt
        answer = task.job.params.max_tokens or cells_left
        return prompt - forked + max(0, min(answer, cells_left))

    def best_block(self, prompt: list[int]) -> tuple[Block | None, int]:
        """The block sharing the longest prefix with `prompt`, and how many tokens a fork
        takes from it (at most all but the prompt's last token: its logits are needed)."""
        best, forked = None, 0
        for block in self.blocks:
            shared = min(common_prefix(block.tokens, prompt), len(prompt) - 1)
            if shared > forked:
                best, forked = block, shared
        return best, forked

    def decide(
        self, window: list[Task], branches: list[Seq], others: list[list[int]]
    ) -> SharedRound:
        """Place the lines of `window` (queue order) that share a block, and the blocks they
        need. `others`: the prompts the main context holds or evaluates, which count as
        company: a line that shares a long prefix with one of them starts a block here.

        Blocks open one at a time: a block's lines run together in a wave, and the next
        block opens when the wave is done. Every cell of the stream costs each query row a
        look at its mask, so the lines of four blocks at once would each pay for the other
        three."""
        self._round += 1
        self._free_ids = sorted(self._free_ids + self._parked_ids)
        self._parked_ids = []
        plan = SharedRound()
        if any(b.users or b.pending for b in self.blocks):
            self._park_idle(None, plan)  # idle blocks left beside a block that opened since
        mine = [t for t in window if fits_here(t) and len(_prompt(t)) > MIN_BLOCK_TOKENS]
        if not mine:
            return plan
        busy = [s for s in branches if s.busy]
        self._running, self._reserved, self._taken = len(busy), sum(s.reserved for s in busy), 0
        self._free = [s for s in branches if not s.busy][: max(0, self.max_wave - self._running)]
        company = self._company(mine, others)
        wants_new: list[tuple[Task, Block | None, int, int]] = []
        cells_short = False  # lines of a ready block wait for cells: no new block yet
        for task in mine:
            block, forked = self._match(task)
            group = company.get(id(task), 0)
            if group >= forked + MIN_BLOCK_TOKENS:
                wants_new.append((task, block, forked, group))
            elif block is not None and forked >= MIN_BLOCK_TOKENS:
                cells_short |= self._place(task, block, forked, plan) and block.ready
        for task, block, forked, group in wants_new:
            prompt = _prompt(task)
            opened = self._opened(prompt[:group])
            if opened is None and self._may_open(cells_short):
                opened = self._new_block(prompt[:group], block, forked, plan)
            if opened is not None:
                block, forked = opened, min(group, len(prompt) - 1)
            elif self._free_ids or any(b.users == 0 and b.ready for b in self.blocks):
                plan.held.add(id(task))  # its block's turn comes after the open one's
                continue
            if block is not None and forked >= MIN_BLOCK_TOKENS:
                self._place(task, block, forked, plan)
        return plan

    def _cells_free(self) -> int:
        """Cells free for reservations this round: `cells_in_use` less what it started."""
        return self.n_cells - CELL_MARGIN - self._block_cells() - self._reserved - self._taken

    def _place(self, task: Task, block: Block, forked: int, plan: SharedRound) -> bool:
        """Start `task` as a line forked from `block`, or hold it for later; returns True
        when it must wait for cells (False: started, waits for the block, or not for here)."""
        need = self.reserve(task, forked)
        if need > (self.n_cells - CELL_MARGIN) // 4:
            return False  # a long answer would crowd out the lines that share: main context
        plan.held.add(id(task))
        if not block.ready:
            return False  # it forks once the block is evaluated
        if block.parked and not self._restore(block, plan):
            return False  # it comes back when no other block runs
        free = self._cells_free()
        if need > free and self._free:
            free += self._drop_idle(need - free, block, plan)
        if need > free and not self._taken and not self._running:
            plan.held.discard(id(task))  # too few cells even with nothing else here: main context
            return False
        if not self._free or need > free:
            return True
        branch = self._free.pop(0)
        block.users += 1
        block.used = self._round
        self._taken += need
        plan.starts.append(Start(task, branch, block, forked, need))
        return False

    def _drop_idle(self, cells: int, keep: Block, plan: SharedRound) -> int:
        """Park idle blocks but `keep`, the least recently used first, until `cells` are
        free; returns the cells freed."""
        freed = 0
        for victim in sorted(self.blocks, key=lambda b: b.used):
            if freed >= cells:
                break
            if victim is keep or not victim.idle or victim.used == self._round:
                continue
            self._park(victim, plan)
            freed += len(victim.tokens)
        self._trim_parked(plan)
        return freed

    def _park(self, victim: Block, plan: SharedRound) -> None:
        """Take an idle block out of the stream; its seq_id is free from the next round."""
        plan.parked.append((victim, victim.seq_id))
        self._parked_ids.append(victim.seq_id)
        victim.parked = True

    def _park_idle(self, keep: Block | None, plan: SharedRound) -> None:
        """Every idle block but `keep` leaves the stream: another block's lines run now.
        A block this round put back stays (the engine parks before it restores)."""
        for block in self.blocks:
            if block is not keep and block.idle and block.used != self._round:
                self._park(block, plan)
        self._trim_parked(plan)

    def _trim_parked(self, plan: SharedRound) -> None:
        """Parked blocks beyond KEEP_IDLE go, the least recently used first."""
        parked = sorted((b for b in self.blocks if b.parked), key=lambda b: b.used)
        for victim in parked[: max(0, len(parked) - KEEP_IDLE)]:
            self._drop(victim, plan)

    def _restore(self, block: Block, plan: SharedRound) -> bool:
        """Put a parked block back, when no other block runs or waits and its cells fit
        (the others idle leave); False: not now."""
        busy = any(b.users or b.pending or b.used == self._round for b in self.blocks)
        if busy or not self._free_ids:
            return False
        self._park_idle(block, plan)
        if len(block.tokens) > self._cells_free():
            return False
        block.parked = False
        block.seq_id = self._free_ids.pop(0)
        block.used = self._round
        plan.restored.append(block)
        self._version += 1
        return True

    def _drop(self, victim: Block, plan: SharedRound) -> None:
        self.blocks.remove(victim)
        if not victim.parked:
            self._free_ids.append(victim.seq_id)
        plan.dropped.append(victim)
        self._version += 1

    def _opened(self, tokens: list[int]) -> Block | None:
        """A block made earlier for the same prefix (this round's, or one still pending)."""
        for block in self.blocks:
            if block.tokens == tokens:
                return block
        return None

    def _may_open(self, cells_short: bool) -> bool:
        """Whether a new block may open now: none is being evaluated, and no other block's
        lines wait or run. Opening the next block while the last wave decodes made shared4
        slower (engine directly: 20.2 against 19.1 s with no idle block kept, 21.5 against
        19.8 s with one): its cells widen every row's look at the mask."""
        if cells_short or any(not b.ready for b in self.blocks):
            return False
        return not any(b.users for b in self.blocks)

    def _match(self, task: Task) -> tuple[Block | None, int]:
        """`best_block` of a task's prompt, kept on the task while the blocks stay the same
        (a line waiting for cells is looked at every round)."""
        if task.shared_match is None or task.shared_match[0] != self._version:
            task.shared_match = (self._version, *self.best_block(_prompt(task)))
        _, block, forked = task.shared_match
        return block, forked

    def _company(self, mine: list[Task], others: list[list[int]]) -> dict[int, int]:
        """For each task, how many leading tokens it shares with the other waiting lines or
        prompts of the main context that share its longest shared run of chunks (absent
        when under MIN_BLOCK_TOKENS)."""
        counts: Counter[int] = Counter()
        for task in mine:
            counts.update(_keys(task))
        longer = [p for p in others if len(p) > MIN_BLOCK_TOKENS]
        other_keys = [chunk_keys(p) for p in longer]
        for keys in other_keys:
            counts.update(keys)
        # Tasks by the last chunk they share: the members of one group.
        groups: dict[tuple[int, int], list[Task]] = {}
        for task in mine:
            keys = _keys(task)
            depth = 0
            while depth < len(keys) and counts[keys[depth]] >= 2:
                depth += 1
            if depth * PREFIX_CHUNK >= MIN_BLOCK_TOKENS:
                groups.setdefault((depth, keys[depth - 1]), []).append(task)
        out: dict[int, int] = {}
        for (depth, key), members in groups.items():
            first = _prompt(members[0])
            prompts = [_prompt(t) for t in members[1:]]
            prompts += [p for p, k in zip(longer, other_keys, strict=True) if _has(k, depth, key)]
            # The exact shared prefix, up to the token, across every member of the group.
            shared = min((common_prefix(first, p) for p in prompts), default=depth * PREFIX_CHUNK)
            for task in members:
                out[id(task)] = shared
        return out

    def _new_block(
        self,
        tokens: list[int],
        base: Block | None,
        base_shared: int,
        plan: SharedRound,
    ) -> Block | None:
        """A block for `tokens`, forked from `base` where they share a prefix; None when
        no sequence or cells are free. The idle blocks leave the stream (a base after the
        fork: the engine copies before it parks)."""
        fork = base is not None and base.idle and base.used != self._round
        start = base_shared if fork else 0
        self._park_idle(base if start else None, plan)
        if not self._free_ids or len(tokens) > self._cells_free():
            return None
        if start:
            assert base is not None
            self._park(base, plan)
            self._trim_parked(plan)
        block = Block(
            self._free_ids.pop(0),
            tokens,
            pending=tokens[start:],
            pos=start,
            used=self._round,
            source=base if start else None,
        )
        self.blocks.append(block)
        plan.new_blocks.append(block)
        self._version += 1
        return block

    def reset(self) -> list[Block]:
        """Forget every block (after a failed decode); returns them, for their cells to go."""
        gone, self.blocks = self.blocks, []
        self._version += 1
        in_stream = [b.seq_id for b in gone if not b.parked]
        self._free_ids = sorted(self._free_ids + self._parked_ids + in_stream)
        self._parked_ids = []
        return gone

    def forget(self, block: Block) -> None:
        """Forget a block the engine could not put back in the stream (its seq_id is free)."""
        self.blocks.remove(block)
        self._free_ids.append(block.seq_id)
        self._version += 1


def _has(keys: list[int], depth: int, key: int) -> bool:
    return len(keys) >= depth and keys[depth - 1] == key
