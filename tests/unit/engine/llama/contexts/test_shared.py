"""The shared-prefix context's decisions (shared.py), on lines with no model behind them:
which lines fork from which block, when a block opens, waits and goes."""

from __future__ import annotations

from app.engine.base import Priority
from app.engine.llama.contexts.shared import (
    CELL_MARGIN,
    KEEP_IDLE,
    MIN_BLOCK_TOKENS,
    Block,
    SharedBlocks,
    SharedRound,
)
from app.engine.llama.contexts.slots import Seq
from tests.unit.engine.llama.contexts.test_slots import job, task

CTX = 1024
BLOCK_A = list(range(1000, 1000 + 300))
BLOCK_B = list(range(5000, 5000 + 300))


def line(block: list[int], i: int, *, max_tokens: int = 4, **kw: object) -> object:
    """A batch line: the block, then a few tokens of its own."""
    j = job([*block, 70000 + i, 70100 + i, 70200 + i], **kw)  # type: ignore[arg-type]
    j.params.max_tokens = max_tokens
    return task(j)


def setup(
    n_branches: int = 8, n_blocks: int = 4, n_cells: int = 4096
) -> tuple[SharedBlocks, list[Seq]]:
    shared = SharedBlocks(
        n_branches=n_branches, n_blocks=n_blocks, n_cells=n_cells, ctx_per_branch=CTX
    )
    return shared, [Seq(i) for i in range(n_branches)]


def carry_out(shared: SharedBlocks, lines: list[Seq], plan: SharedRound) -> None:
    """What the engine does with a plan, as far as these decisions see it: blocks get
    evaluated, started lines take their line and reservation."""
    for block in plan.new_blocks:
        block.pos += len(block.pending)
        block.pending = []
    for start in plan.starts:
        j = start.task.job
        start.branch.take(j, j.choices[0], len(j.prompts[0]), None, ctx_per_slot=CTX)
        start.branch.block, start.branch.reserved = start.block, start.reserved


def finish(shared: SharedBlocks, lines: list[Seq]) -> None:
    for slot in lines:
        if slot.busy:
            slot.block.users -= 1
            slot.clear()


def test_lines_sharing_a_block_wait_for_it_then_all_fork_from_it() -> None:
    shared, lines = setup()
    tasks = [line(BLOCK_A, i) for i in range(5)]
    first = shared.decide(tasks, lines, [])
    # One block for the shared prefix (up to the token), evaluated before any line forks.
    assert [b.tokens for b in first.new_blocks] == [BLOCK_A]
    assert first.starts == [] and first.held == {id(t) for t in tasks}
    carry_out(shared, lines, first)
    second = shared.decide(tasks, lines, [])
    assert [s.task for s in second.starts] == tasks
    assert {s.block for s in second.starts} == {first.new_blocks[0]}
    assert all(s.forked == len(BLOCK_A) for s in second.starts)
    # Each line holds its own 3 prompt tokens and 4 answer tokens beyond the block.
    assert all(s.reserved == 3 + 4 for s in second.starts)
    assert len({s.branch.seq_id for s in second.starts}) == 5


def test_a_lone_line_with_a_long_prompt_stays_in_the_main_context() -> None:
    shared, lines = setup()
    plan = shared.decide([line(BLOCK_A, 0)], lines, [])
    assert plan.new_blocks == [] and plan.held == set() and plan.starts == []


def test_a_prompt_the_main_context_holds_counts_as_company() -> None:
    """A line sharing its block with a prompt already in a slot (the file's first line,
    say) opens a block here rather than recompute it beside the slot."""
    shared, lines = setup()
    t = line(BLOCK_A, 1)
    plan = shared.decide([t], lines, [[*BLOCK_A, 9, 9, 9]])
    assert [b.tokens for b in plan.new_blocks] == [BLOCK_A]
    assert plan.held == {id(t)}


def test_short_shared_prefixes_and_other_kinds_of_work_stay_in_the_main_context() -> None:
    shared, lines = setup()
    short = list(range(MIN_BLOCK_TOKENS - 40))
    tasks = [task(job(short + [i] * 60)) for i in range(3)]  # long prompts, short prefix
    online = [line(BLOCK_A, i, priority=Priority.ONLINE) for i in range(3)]
    n_two = [line(BLOCK_B, i, n=2) for i in range(3)]
    plan = shared.decide(tasks + online + n_two, lines, [])
    assert plan == SharedRound()


def test_blocks_open_one_at_a_time_and_idle_ones_are_parked_up_to_keep_idle() -> None:
    shared, lines = setup(n_blocks=KEEP_IDLE + 3)
    a = [line(BLOCK_A, i) for i in range(3)]
    b = [line(BLOCK_B, i) for i in range(3)]
    mixed = [a[0], b[0], a[1], b[1], a[2], b[2]]
    plan = shared.decide(mixed, lines, [])
    # A's block opens; B's lines wait their turn instead of running in the main context.
    assert [blk.tokens for blk in plan.new_blocks] == [BLOCK_A]
    assert plan.held == {id(t) for t in mixed}
    carry_out(shared, lines, plan)
    plan = shared.decide(mixed, lines, [])
    assert [s.task for s in plan.starts] == a and plan.new_blocks == []
    carry_out(shared, lines, plan)
    rest = b
    assert shared.decide(rest, lines, []).new_blocks == []  # A's wave still runs
    finish(shared, lines)
    block_a = shared.blocks[0]
    plan = shared.decide(rest, lines, [])
    assert [blk.tokens for blk in plan.new_blocks] == [BLOCK_B]
    # A leaves the stream (its cells would widen every row's look at the mask) and is
    # kept for its lines still to come; its sequence id is not B's.
    assert plan.parked == [(block_a, block_a.seq_id)] and plan.dropped == []
    assert block_a.parked and shared.cells_in_use(lines) == len(BLOCK_B)
    assert plan.new_blocks[0].seq_id != block_a.seq_id
    carry_out(shared, lines, plan)
    carry_out(shared, lines, shared.decide(rest, lines, []))
    finish(shared, lines)
    # More blocks, each with one wave: past KEEP_IDLE parked blocks, the least recent goes.
    blocks = [list(range(20_000 * k, 20_000 * k + 200)) for k in range(1, KEEP_IDLE + 1)]
    dropped = []
    for block in blocks:
        tasks = [line(block, i) for i in range(2)]
        for _ in range(2):
            plan = shared.decide(tasks, lines, [])
            dropped += [blk.tokens for blk in plan.dropped]
            carry_out(shared, lines, plan)
        finish(shared, lines)
    assert dropped == [BLOCK_A]
    assert len(shared.blocks) == KEEP_IDLE + 1
    assert [b.tokens for b in shared.blocks if not b.parked] == [blocks[-1]]


def test_a_later_batch_forks_from_the_block_kept_from_the_last() -> None:
    shared, lines = setup()
    tasks = [line(BLOCK_A, i) for i in range(2)]
    carry_out(shared, lines, shared.decide(tasks, lines, []))
    carry_out(shared, lines, shared.decide(tasks, lines, []))
    finish(shared, lines)
    later = line(BLOCK_A, 9)  # alone, and the first of its batch
    plan = shared.decide([later], lines, [])
    assert [s.task for s in plan.starts] == [later] and plan.new_blocks == []


def test_lines_wait_for_room_and_no_new_block_opens_meanwhile() -> None:
    # Cells for the block and two lines of 3 + 100 cells each.
    shared, lines = setup(n_cells=CELL_MARGIN + 300 + 2 * 103 + 50)
    a = [line(BLOCK_A, i, max_tokens=100) for i in range(4)]
    carry_out(shared, lines, shared.decide(a, lines, []))
    plan = shared.decide([*a, line(BLOCK_B, 0), line(BLOCK_B, 1)], lines, [])
    assert [s.task for s in plan.starts] == a[:2]
    assert id(a[2]) in plan.held and id(a[3]) in plan.held
    assert plan.new_blocks == []
    assert shared.cells_in_use(lines) == 300  # the started lines are not taken yet
    carry_out(shared, lines, plan)
    assert shared.cells_in_use(lines) == 300 + 2 * 103


def test_a_line_whose_answer_would_crowd_the_context_runs_in_the_main_context() -> None:
    # 3 + 721 cells a line, more than a quarter of the cells past the margin.
    shared, lines = setup(n_cells=2048)
    long_answers = [line(BLOCK_A, i, max_tokens=0) for i in range(2)]  # 0: up to ctx
    carry_out(shared, lines, shared.decide(long_answers, lines, []))
    plan = shared.decide(long_answers, lines, [])
    assert plan.starts == [] and plan.held == set()


def test_no_free_block_sequence_means_the_main_context() -> None:
    shared, lines = setup(n_blocks=1)
    busy = Block(seq_id=8, tokens=BLOCK_B, users=1)
    shared.blocks.append(busy)
    shared._free_ids.clear()
    tasks = [line(BLOCK_A, i) for i in range(2)]
    plan = shared.decide(tasks, lines, [])
    assert plan.new_blocks == [] and plan.held == set()


def test_a_longer_shared_prefix_extends_a_block_by_forking_from_it() -> None:
    shared, lines = setup()
    head = BLOCK_A[: MIN_BLOCK_TOKENS + 10]
    carry_out(shared, lines, shared.decide([line(head, 0), line(head, 1)], lines, []))
    finish(shared, lines)
    tasks = [line(BLOCK_A, i) for i in range(2)]  # share all of BLOCK_A, the block its head
    plan = shared.decide(tasks, lines, [])
    (new,) = plan.new_blocks
    assert new.tokens == BLOCK_A
    assert new.source is not None and new.pos == len(head)
    assert new.pending == BLOCK_A[len(head) :]
    # The head block leaves the stream once the new block has forked from it.
    assert plan.parked == [(new.source, new.source.seq_id)]


def test_a_parked_block_comes_back_for_its_lines_once_the_other_block_is_done() -> None:
    shared, lines = setup(n_blocks=2)
    a = [line(BLOCK_A, i) for i in range(2)]
    carry_out(shared, lines, shared.decide(a, lines, []))
    carry_out(shared, lines, shared.decide(a, lines, []))
    finish(shared, lines)
    b = [line(BLOCK_B, i) for i in range(2)]
    carry_out(shared, lines, shared.decide(b, lines, []))  # B opens, A is parked
    carry_out(shared, lines, shared.decide(b, lines, []))  # B's wave
    block_a, block_b = shared.blocks
    assert block_a.parked and not block_b.parked
    later = [line(BLOCK_A, 10 + i) for i in range(2)]  # the runner's next claim
    plan = shared.decide(later, lines, [])
    assert plan.restored == [] and plan.held == {id(t) for t in later}  # B's wave runs
    finish(shared, lines)
    plan = shared.decide(later, lines, [])
    # B leaves, A comes back under a free sequence id, and the lines fork from it at once.
    assert plan.parked == [(block_b, block_b.seq_id)] and plan.restored == [block_a]
    assert not block_a.parked and block_a.seq_id != block_b.seq_id
    assert plan.new_blocks == [] and [s.task for s in plan.starts] == later
    assert all(s.block is block_a and s.forked == len(BLOCK_A) for s in plan.starts)


def test_an_idle_block_leaves_the_stream_when_a_waiting_line_needs_its_cells() -> None:
    # Two evaluated blocks in the stream, nothing running (a block put back, and another
    # opened, in one round): B's lines need the cells A holds.
    shared, lines = setup(n_cells=CELL_MARGIN + 300 + 300 + 20)
    a, b = Block(seq_id=8, tokens=BLOCK_A, used=1), Block(seq_id=9, tokens=BLOCK_B, used=2)
    shared.blocks += [a, b]
    shared._free_ids = [i for i in shared._free_ids if i not in (8, 9)]
    shared._round = 5  # both were used in earlier rounds
    tasks = [line(BLOCK_B, i, max_tokens=30) for i in range(2)]
    plan = shared.decide(tasks, lines, [])
    assert plan.parked == [(a, 8)] and plan.dropped == [] and a.parked
    assert [s.task for s in plan.starts] == tasks and {s.block for s in plan.starts} == {b}


def test_a_block_that_could_not_come_back_is_forgotten_and_made_again() -> None:
    shared, lines = setup(n_blocks=2)
    tasks = [line(BLOCK_A, i) for i in range(2)]
    carry_out(shared, lines, shared.decide(tasks, lines, []))
    (block,) = shared.blocks
    shared.forget(block)  # the engine found no room to put its cells back
    plan = shared.decide(tasks, lines, [])
    assert [b.tokens for b in plan.new_blocks] == [BLOCK_A] and plan.starts == []
