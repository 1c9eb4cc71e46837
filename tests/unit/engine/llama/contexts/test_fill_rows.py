"""A step's rows (sequences.fill_rows): in the slots' context every generating slot feeds the
same number of forced tokens, so llama.cpp cuts no extra ubatch, and forced tokens and prompts
together never pass the step's budget (the llama_batch holds n_batch rows, no more)."""

from __future__ import annotations

from types import SimpleNamespace

from app.engine.llama.contexts.sequences import fill_rows
from app.engine.llama.contexts.slots import Seq


def batch(rows: int) -> SimpleNamespace:
    return SimpleNamespace(
        token=[0] * rows,
        pos=[0] * rows,
        n_seq_id=[0] * rows,
        seq_id=[[0] for _ in range(rows)],
        logits=[False] * rows,
    )


def generating(seq_id: int, forced: list[int]) -> Seq:
    slot = Seq(seq_id)
    slot.generate(100 + seq_id)
    slot.forced = list(forced)
    return slot


def prompting(seq_id: int, tokens: int) -> Seq:
    slot = Seq(seq_id)
    slot.pending = list(range(tokens))
    return slot


def rows_of(b: SimpleNamespace, n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in range(n):
        out[b.seq_id[i][0]] = out.get(b.seq_id[i][0], 0) + 1
    return out


def test_every_generating_slot_feeds_as_many_forced_tokens_as_the_fewest() -> None:
    slots = [generating(0, [1, 2, 3]), generating(1, [4, 5]), generating(2, [6, 7, 8, 9])]
    b = batch(64)
    n = fill_rows(slots, b, 0, 60, set(), streams=True)
    assert rows_of(b, n) == {0: 3, 1: 3, 2: 3}  # the sampled token and two forced each
    # Slot 1's run is done: its last row has logits; the others' rest waits, no logits now.
    assert [s.i_batch for s in slots] == [-1, 5, -1]
    assert (slots[0].token, slots[0].forced, slots[2].token, slots[2].forced) == (3, [], 8, [9])


def test_a_slot_without_forced_tokens_keeps_every_slot_to_one_row() -> None:
    slots = [generating(0, [1, 2, 3]), generating(1, [])]
    b = batch(8)
    n = fill_rows(slots, b, 0, 8, set(), streams=True)
    assert rows_of(b, n) == {0: 1, 1: 1}
    # One KV stream (the shared-prefix context): each slot's whole run goes in.
    slots = [generating(0, [1, 2, 3]), generating(1, [])]
    n = fill_rows(slots, b, 0, 8, set())
    assert rows_of(b, n) == {0: 4, 1: 1}


def test_a_prompt_before_them_leaves_the_forced_tokens_their_room() -> None:
    # A long prompt in the first slot and forced tokens in the later ones: together no more
    # than the budget beside one row per generating slot.
    slots = [prompting(0, 500), *(generating(i, [1, 2]) for i in range(1, 5))]
    budget = 100
    b = batch(4 + budget)
    n = fill_rows(slots, b, 0, budget, set(), streams=True)
    assert n <= 4 + budget
    assert rows_of(b, n) == {0: budget - 8, 1: 3, 2: 3, 3: 3, 4: 3}
