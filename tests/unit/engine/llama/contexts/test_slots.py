"""The engine's scheduling decisions, on slots with no model behind them."""

from __future__ import annotations

import heapq
import itertools
import subprocess
import sys

from app.engine.base import Priority
from app.engine.llama.contexts.slots import (
    BATCH_PROMPT_TOKENS_PER_STEP,
    MIN_COPY_TOKENS,
    MIN_WAIT_CHUNKS,
    ONLINE_BATCH_WINDOW,
    PREFIX_CHUNK,
    PROMPT_TOKENS_PER_STEP,
    Scheduler,
    Seq,
    SeqState,
    chunk_keys,
    common_prefix,
    leading,
)
from app.engine.llama.jobs.jobs import Choice, Job, Task
from app.wire.endpoints import CHAT, EMBEDDINGS

CTX = 512
_seq = itertools.count()


def job(prompt: list[int], priority: Priority = Priority.BATCH, n: int = 1) -> Job:
    j = Job(CHAT, {}, priority, None)
    j.prompts = [prompt]
    j.params.n = n
    j.choices = [Choice(i) for i in range(n)]
    j.unfinished = n
    return j


def task(j: Job, indices: list[int] | None = None) -> Task:
    return Task(int(j.priority), next(_seq), j, 0, indices or list(range(len(j.choices))))


def queue_of(*tasks: Task) -> list[Task]:
    q: list[Task] = []
    for t in tasks:
        heapq.heappush(q, t)
    return q


def occupy(slot: Seq, priority: Priority = Priority.BATCH) -> None:
    j = job([1, 2, 3], priority)
    slot.take(j, j.choices[0], 3, None, ctx_per_slot=CTX)


def test_online_goes_first_to_the_highest_slot_and_one_slot_stays_free_of_batch_lines() -> None:
    slots = [Seq(i) for i in range(4)]
    lines = [task(job([10 + i])) for i in range(4)]
    online = task(job([99], Priority.ONLINE))
    q = queue_of(*lines, online)
    admitted = Scheduler(4).admit(q, slots).starts
    # The online request sorts first and lands above the batch room; batch lines take the
    # lowest slots, so their sequence ids are one run; the fourth line waits.
    assert [(t.job.priority, [s.seq_id for s in g]) for t, g in admitted] == [
        (Priority.ONLINE, [3]),
        (Priority.BATCH, [0]),
        (Priority.BATCH, [1]),
        (Priority.BATCH, [2]),
    ]
    assert q == [lines[3]]


def test_batch_lines_leave_the_reserved_slot_free_even_when_idle() -> None:
    slots = [Seq(i) for i in range(4)]
    q = queue_of(*[task(job([i])) for i in range(4)])
    admitted = Scheduler(4).admit(q, slots).starts
    assert [g[0].seq_id for _, g in admitted] == [0, 1, 2]
    assert len(q) == 1
    # With a single slot nothing is kept back.
    one = [Seq(0)]
    assert len(Scheduler(1).admit(queue_of(task(job([1]))), one).starts) == 1


def test_a_batch_line_over_the_room_waits_unless_no_batch_line_runs() -> None:
    slots = [Seq(i) for i in range(4)]
    wide = task(job([5], n=4))  # four choices: more than the batch room of three
    assert [len(g) for _, g in Scheduler(4).admit(queue_of(wide), slots).starts] == [4]
    slots = [Seq(i) for i in range(6)]
    occupy(slots[0])
    q = queue_of(task(job([5], n=5)))
    assert Scheduler(6).admit(q, slots).starts == [] and len(q) == 1


def test_the_head_of_the_queue_is_not_overtaken_by_smaller_tasks() -> None:
    slots = [Seq(i) for i in range(4)]
    occupy(slots[3], Priority.ONLINE)
    occupy(slots[2], Priority.ONLINE)
    big = task(job([1], Priority.ONLINE, n=3))  # needs three slots; two are free
    small = task(job([2], Priority.ONLINE))
    q = queue_of(big, small)
    assert Scheduler(4).admit(q, slots).starts == []
    assert [t.job for t in sorted(q)] == [big.job, small.job]


def test_cancelled_tasks_are_dropped_and_embeddings_handed_back() -> None:
    slots = [Seq(i) for i in range(2)]
    gone = task(job([1], Priority.ONLINE))
    gone.job.cancelled = True
    emb = Job(EMBEDDINGS, {}, Priority.ONLINE, None)
    emb.prompts = [[1, 2]]
    q = queue_of(gone, Task(0, next(_seq), emb), task(job([3], Priority.ONLINE)))
    admission = Scheduler(2).admit(q, slots)
    assert admission.embeds == [emb]
    assert [t.job.prompts for t, _ in admission.starts] == [[[3]]]
    assert q == []


def test_the_leader_lands_where_the_longest_prefix_is_cached_and_siblings_where_least() -> None:
    slots = [Seq(i) for i in range(6)]
    slots[0].cached = [7, 7, 7, 7, 7, 7]
    slots[1].cached = [1, 2, 9]
    slots[2].cached = [1, 2, 3, 9, 9]
    slots[3].cached = [8, 8]
    slots[4].cached = []
    slots[5].cached = [8]
    t = task(job([1, 2, 3, 4], Priority.ONLINE, n=3))
    (admitted, group), *_ = Scheduler(6).admit(queue_of(t), slots).starts
    assert admitted is t
    # Seq 2 shares [1, 2, 3]; the siblings take the emptiest caches, which they overwrite.
    assert [s.seq_id for s in group] == [2, 4, 5]
    # No shared prefix in a batch line's slots (0 and 1, below the reserved one): the tie
    # goes to the lowest slot, so lines admitted together decode as one run of sequences.
    slots = [Seq(i) for i in range(3)]
    slots[0].cached, slots[1].cached, slots[2].cached = [5, 5, 5], [6], []
    (_, group), *_ = Scheduler(3).admit(queue_of(task(job([1, 2]))), slots).starts
    assert [s.seq_id for s in group] == [0]
    slots[1].cached = [1, 7]  # a shared prefix still wins
    (_, group), *_ = Scheduler(3).admit(queue_of(task(job([1, 2]))), slots).starts
    assert [s.seq_id for s in group] == [1]


def test_online_requests_hold_batch_lines_back_in_turns_of_consecutive_slots() -> None:
    assert ONLINE_BATCH_WINDOW == 8
    scheduler = Scheduler(20)
    slots = [Seq(i) for i in range(20)]
    for slot in slots[:19]:
        occupy(slot, Priority.BATCH)
    assert scheduler.held_back(slots) == set()  # no online request: every batch line decodes
    occupy(slots[19], Priority.ONLINE)
    turns = [sorted(set(range(19)) - scheduler.held_back(slots)) for _ in range(4)]
    assert turns == [list(range(8, 16)), list(range(16, 19)), list(range(8)), list(range(8, 16))]


def test_few_batch_lines_beside_an_online_request_all_decode() -> None:
    slots = [Seq(i) for i in range(10)]
    for slot in slots[:ONLINE_BATCH_WINDOW]:
        occupy(slot, Priority.BATCH)
    occupy(slots[9], Priority.ONLINE)
    assert Scheduler(10).held_back(slots) == set()


def test_prefix_source_keeps_its_own_cache_unless_another_holds_enough_more() -> None:
    prompt = list(range(40))
    slot, other = Seq(0), Seq(1)
    slot.cached = [*prompt[:10], 99]
    scheduler = Scheduler(2)
    assert scheduler.prefix_source(slot, prompt, [slot, other], set()) == (None, 10)
    other.cached = prompt[: 10 + MIN_COPY_TOKENS - 1]
    assert scheduler.prefix_source(slot, prompt, [slot, other], set()) == (None, 10)
    other.cached = prompt[: 10 + MIN_COPY_TOKENS]
    assert scheduler.prefix_source(slot, prompt, [slot, other], set()) == (
        other,
        10 + MIN_COPY_TOKENS,
    )
    # A slot whose own stream copy is still queued is no source until the next decode.
    assert scheduler.prefix_source(slot, prompt, [slot, other], {1}) == (None, 10)


def test_prefix_source_leaves_the_last_prompt_token_and_obeys_prefix_cache_off() -> None:
    prompt = [1, 2, 3, 4, 5]
    slot = Seq(0)
    slot.cached = [*prompt, 6, 7]
    # The first sampled token needs the last prompt token's logits.
    assert Scheduler(1).prefix_source(slot, prompt, [slot], set()) == (None, 4)
    other = Seq(1)
    other.cached = list(range(100, 120))
    off = Scheduler(2, prefix_cache=False)
    assert off.prefix_source(slot, prompt, [slot, other], set()) == (None, 0)


def test_slot_states_follow_a_choice_from_prompt_to_release() -> None:
    j = job([1, 2, 3, 4], Priority.ONLINE, n=2)
    j.params.max_tokens = 1000
    leader, follower = Seq(0), Seq(1)
    assert leader.state is SeqState.IDLE and not leader.busy
    leader.take(j, j.choices[0], 4, None, ctx_per_slot=CTX)
    follower.take(j, j.choices[1], 4, leader, ctx_per_slot=CTX)
    assert (leader.state, follower.state) == (SeqState.PROMPT, SeqState.WAIT_LEADER)
    assert leader.followers == [follower] and follower.leader is leader
    assert leader.busy and not leader.generating
    assert leader.max_tokens == CTX - 4  # max_tokens is cut to the room the slot has
    leader.generate(42)
    assert leader.state is SeqState.GENERATING and leader.generating and leader.token == 42
    leader.cached = [1, 2, 3, 4, 42]
    leader.clear()
    assert leader.state is SeqState.IDLE and leader.job is None
    assert leader.cached == [1, 2, 3, 4, 42]  # the KV stays for a later prompt


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2
    long = list(range(200))
    assert common_prefix(long, [*long[:150], -1, *long[151:]]) == 150
    assert common_prefix(long, [*long, 7]) == 200


def test_chunk_keys_stand_for_whole_prefixes() -> None:
    a = list(range(3 * PREFIX_CHUNK + 5))
    b = a[: 2 * PREFIX_CHUNK] + [-1] * (PREFIX_CHUNK + 5)
    assert len(chunk_keys(a)) == 3
    assert leading(chunk_keys(b), set(chunk_keys(a))) == 2
    # The same chunk after a different prefix is another key.
    c = [-1] * PREFIX_CHUNK + a[PREFIX_CHUNK : 2 * PREFIX_CHUNK]
    assert leading(chunk_keys(c)[1:], set(chunk_keys(a))) == 0


BLOCK_A = [1000 + i for i in range(8 * PREFIX_CHUNK)]  # an instruction block of 8 chunks
BLOCK_B = [5000 + i for i in range(8 * PREFIX_CHUNK)]


def line(block: list[int], i: int) -> Task:
    return task(job([*block, i, i + 1, i + 2]))


def test_batch_lines_wait_for_the_block_being_computed_and_others_go_ahead() -> None:
    slots = [Seq(i) for i in range(8)]
    a1, a2, b1, a3, b2 = (
        line(BLOCK_A, 1),
        line(BLOCK_A, 2),
        line(BLOCK_B, 3),
        line(BLOCK_A, 4),
        line(BLOCK_B, 5),
    )
    # A line sharing less than MIN_WAIT_CHUNKS with the block computes its own prompt.
    near = line(BLOCK_A[: (MIN_WAIT_CHUNKS - 1) * PREFIX_CHUNK] + [-1] * PREFIX_CHUNK, 6)
    q = queue_of(a1, a2, b1, a3, b2, near)
    scheduler = Scheduler(8)
    # Nothing cached: each block's first line computes it; the lines that share it wait
    # rather than compute it again beside it, and do not hold up the other block's line.
    starts = scheduler.admit(q, slots).starts
    assert [t for t, _ in starts] == [a1, b1, near]
    starts = starts[:2]
    assert sorted(q) == [a2, a3, b2]
    for t, (slot,) in starts:  # the loop puts the first chunks of the prompts into a step
        prompt = t.job.prompts[0]
        slot.take(t.job, t.job.choices[0], len(prompt), None, ctx_per_slot=CTX)
        slot.cached, slot.pending = prompt[: 2 * PREFIX_CHUNK], prompt[2 * PREFIX_CHUNK :]
    assert scheduler.admit(q, slots).starts == []  # still being computed: they keep waiting
    for t, (slot,) in starts:  # the next step finishes the prompts
        slot.cached, slot.pending = t.job.prompts[0], []
        slot.generate(1)
    assert sorted(t for t, _ in scheduler.admit(q, slots).starts) == sorted([a2, a3, b2])
    assert q == []


def test_lines_sharing_a_chat_templates_system_prompt_wait_for_the_first_to_compute_it() -> None:
    """SmolLM2's template puts a 24-token system prompt before every chat: the first line of
    a file computes it, the others wait a step and fork from it rather than each computing it
    again in its own slot (issue 39: 414 then 560 of 985 prompt tokens cached)."""
    template = [7000 + i for i in range(24)]
    slots = [Seq(i) for i in range(8)]
    first, *others = (task(job(template + [100 * i + k for k in range(15)])) for i in range(4))
    q = queue_of(first, *others)
    scheduler = Scheduler(len(slots))
    starts = scheduler.admit(q, slots).starts
    assert [t for t, _ in starts] == [first]  # three free slots left idle for a step
    ((_, (slot,)),) = starts
    prompt = first.job.prompts[0]
    slot.take(first.job, first.job.choices[0], len(prompt), None, ctx_per_slot=CTX)
    slot.cached, slot.pending = prompt, []
    slot.generate(1)
    later = scheduler.admit(q, slots).starts
    assert sorted(t for t, _ in later) == sorted(others) and q == []
    # Each forks the template's 24 tokens from the first line's slot.
    for t, (s,) in later:
        source, keep = scheduler.prefix_source(s, t.job.prompts[0], slots, set())
        assert (source, keep) == (slot, 24)


def test_batch_lines_whose_block_is_cached_start_first() -> None:
    # Longest-prefix-match order: with room for two lines, the two that fork from the cached
    # block start before the older line whose prompt shares nothing cached.
    slots = [Seq(i) for i in range(4)]
    slots[3].cached = [*BLOCK_A, 9]
    occupy(slots[0])
    other, a1, a2 = line(BLOCK_B, 1), line(BLOCK_A, 2), line(BLOCK_A, 3)
    q = queue_of(other, a1, a2)
    starts = Scheduler(4).admit(q, slots).starts
    # Seq 3 is kept for online requests: slots 1 and 2 are the batch room left.
    assert [t for t, _ in starts] == [a1, a2]
    assert q == [other]


def test_the_model_free_rooms_do_not_load_llama_cpp() -> None:
    code = (
        "import sys, app.config, app.engine.llama.contexts.slots, app.engine.llama.jobs.jobs, "
        "app.engine.llama.jobs.prepare, app.engine.llama.jobs.oai.answers, app.engine.llama.jobs.oai.sampling, "
        "app.engine.llama.jobs.oai.tools, app.engine.llama.jobs.oai.chat_template, app.toolchain.facts; "
        "print('llama_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def embedding(n_inputs: int, tokens: int) -> Task:
    j = Job(EMBEDDINGS, {}, Priority.BATCH, None)
    j.prompts = [[1] * tokens for _ in range(n_inputs)]
    return Task(int(j.priority), next(_seq), j)


def test_embedding_requests_share_one_decode_up_to_its_tokens_and_sequences() -> None:
    slots = [Seq(i) for i in range(2)]
    q = queue_of(*(embedding(1, 40) for _ in range(10)))
    by_tokens = Scheduler(2, embed_tokens=130, embed_seqs=64)
    assert len(by_tokens.admit(q, slots).embeds) == 3  # 120 tokens; a fourth would pass 130
    assert len(q) == 7
    by_seqs = Scheduler(2, embed_tokens=10_000, embed_seqs=4)
    assert len(by_seqs.admit(q, slots).embeds) == 4
    # One request bigger than a decode still goes (the embedder splits it); none is stuck.
    big = queue_of(embedding(8, 40))
    assert len(Scheduler(2, embed_tokens=100, embed_seqs=4).admit(big, slots).embeds) == 1


def test_an_embeddings_decode_is_filled_by_later_requests_that_fit() -> None:
    # llama-server fills its ubatch from any slot whose prompt fits; so does a round: the
    # 60-token request does not fit after 50 + 40, the 10-token one behind it does.
    slots = [Seq(i) for i in range(2)]
    a, b, c, d, e = (embedding(1, n) for n in (50, 40, 60, 10, 5))
    q = queue_of(a, b, c, d, e)
    admission = Scheduler(2, embed_tokens=100, embed_seqs=64).admit(q, slots)
    assert admission.embeds == [a.job, b.job, d.job]  # 100 tokens: a full decode
    # What did not fit waits in its order, the oldest first: it heads the next round.
    assert [heapq.heappop(q) for _ in range(len(q))] == [c, e]


def test_the_fill_takes_the_longest_that_fit_and_stops_at_other_work() -> None:
    slots = [Seq(i) for i in range(2)]
    head, big, small, mid = embedding(1, 70), embedding(1, 40), embedding(1, 10), embedding(1, 25)
    chat = Task(int(Priority.BATCH), next(_seq), job([1, 2, 3]))
    late = embedding(1, 5)
    q = queue_of(head, big, small, mid, chat, late)
    admission = Scheduler(2, embed_tokens=100, embed_seqs=64, prefix_cache=False).admit(q, slots)
    # 70, then the longest of the requests heading the queue that fits (25; 40 would pass
    # 100, and 10 more after 95 would too); the chat line ends the window, so 5 waits.
    assert admission.embeds == [head.job, mid.job]
    assert late.job not in admission.embeds


def test_prompt_budget_fills_the_batch_unless_an_online_request_decodes() -> None:
    assert BATCH_PROMPT_TOKENS_PER_STEP > PROMPT_TOKENS_PER_STEP
    slots = [Seq(i) for i in range(4)]
    scheduler = Scheduler(4)
    for slot in slots[:2]:
        occupy(slot)
        slot.generate(7)
    assert scheduler.prompt_budget(slots, 4096) == BATCH_PROMPT_TOKENS_PER_STEP
    assert scheduler.prompt_budget(slots, 1000) == 998  # the generating rows come first
    occupy(slots[3], Priority.ONLINE)
    assert scheduler.prompt_budget(slots, 4096) == PROMPT_TOKENS_PER_STEP
