"""Slots and the scheduling decisions of the engine's loop, without llama.cpp.

A `Job` (jobs.py) is one submitted request; its prompts become `Task`s on a priority queue; a
`Slot` is one llama.cpp sequence and the choice decoding in it. The `Scheduler` decides which tasks
take which free slots, which batch slots sit a step out while an online request decodes,
and which slot's cached KV a new prompt starts from. The loop (engine/llama/engine.py) carries the
decisions out on the llama.cpp context.
"""

from __future__ import annotations

import codecs
import enum
import heapq
from dataclasses import dataclass, field
from typing import Any

from app.engine.base import Priority
from app.engine.llama.jobs import Choice, Job, Task
from app.engine.llama.sampler import StopMatcher
from app.wire.endpoints import EMBEDDINGS

#: Prompt tokens admitted per step while an online request decodes. Bounded so that a long
#: new prompt delays the online tokens by one ubatch at most, not by its whole length.
PROMPT_TOKENS_PER_STEP = 512
#: Prompt tokens admitted per step when only batch lines run: the prompts of many new lines
#: go into one step, and llama.cpp cuts runs of them into full micro-batches (equal chunks of
#: consecutive sequences), rather than a prompt or two a step (bench/README.md).
BATCH_PROMPT_TOKENS_PER_STEP = 2048
#: Slots batch lines may not take: they stay free for online requests.
ONLINE_RESERVED_SLOTS = 1
#: While an online request decodes, each step takes at most this many batch sequences, in
#: turns: a step's cost grows with its rows, and the online tokens should not wait for 31.
ONLINE_BATCH_WINDOW = 8
#: A new prompt copies another slot's KV stream when that shares at least this many more
#: prompt tokens than the slot it lands in. Copying a stream moves the whole ctx_size
#: buffer, which costs about as much as evaluating a few tokens in a batched step.
MIN_COPY_TOKENS = 8


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotState(enum.Enum):
    """Where a slot's sequence is (llama.cpp server's slot_state, the states batchyard has)."""

    IDLE = "idle"  # no request; its KV stays as a cache for later prompts
    PROMPT = "prompt"  # its prompt is being evaluated, in chunks (slot.pending)
    WAIT_LEADER = "wait_leader"  # a sibling choice (n > 1) waiting for the leader's prompt KV
    GENERATING = "generating"  # slot.token is the last sampled token, fed in the next step


# Read on every slot every step: module names are cheaper to reach than enum members.
_IDLE, _GENERATING = SlotState.IDLE, SlotState.GENERATING


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
        self.state = SlotState.IDLE
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

    def take(
        self, job: Job, choice: Choice, prompt_len: int, leader: Slot | None, *, ctx_per_slot: int
    ) -> None:
        """Start a choice here: as the leader that evaluates the prompt, or as its follower."""
        self.clear()
        self.job, self.choice, self.prompt_len = job, choice, prompt_len
        self.stops = StopMatcher(job.stop_strings)
        room = ctx_per_slot - prompt_len
        self.max_tokens = min(job.params.max_tokens or room, room)
        if leader is None:
            self.state = SlotState.PROMPT
        else:
            self.state = SlotState.WAIT_LEADER
            self.leader = leader
            leader.followers.append(self)

    def generate(self, token: int) -> None:
        """The sampled token goes into the next step."""
        self.token = token
        self.state = SlotState.GENERATING

    @property
    def busy(self) -> bool:
        return self.state is not _IDLE

    @property
    def generating(self) -> bool:
        return self.state is _GENERATING


@dataclass
class Admission:
    """What one admission round decided: tasks with their slots (leader first), embeddings."""

    starts: list[tuple[Task, list[Slot]]] = field(default_factory=list)
    embeds: list[Job] = field(default_factory=list)


@dataclass
class _EmbedRound:
    """The inputs of the embeddings decode one admission round fills."""

    tokens: int = 0
    seqs: int = 0


class Scheduler:
    """The loop's decisions: admission, the online window, and where a prompt's KV comes from."""

    def __init__(
        self,
        n_slots: int,
        *,
        prefix_cache: bool = True,
        embed_tokens: int = 0,
        embed_seqs: int = 0,
    ) -> None:
        self.n_slots = n_slots
        self.prefix_cache = prefix_cache
        # One embeddings decode's worth of inputs (0: no bound): each admission round hands
        # over the queued embedding requests that fill one decode together, so a batch's
        # lines share decodes instead of taking one each.
        self.embed_tokens = embed_tokens
        self.embed_seqs = embed_seqs
        # One slot is kept from batch lines, so an online request never waits for a batch
        # line to finish (they run to max_tokens); with a single slot nothing is kept.
        self.batch_room = n_slots - ONLINE_RESERVED_SLOTS if n_slots > 1 else 1
        self.window = 0  # the batch slots' turn while online requests decode (held_back)

    def admit(self, queue: list[Task], slots: list[Slot]) -> Admission:
        """Pop the tasks that fit into free slots off the heap `queue`, highest priority first.

        Strict order: the head of the queue waits (and so does everything behind it) when
        it does not fit, rather than be overtaken. Three rules decide: embeddings fill one
        decode (`_fits_embed_round`), a task takes its pool of free slots (`_place`), and
        its prompt lands where its prefix is cached (`_leader`).
        """
        out = Admission()
        free = [s for s in slots if not s.busy]
        batch_busy = sum(1 for s in slots if s.job is not None and s.job.priority == Priority.BATCH)
        embeds = _EmbedRound()
        while queue:
            task = queue[0]
            if task.job.cancelled:
                heapq.heappop(queue)
                continue
            if task.job.endpoint == EMBEDDINGS:
                if not self._fits_embed_round(embeds, task.job, first=not out.embeds):
                    break  # the next round's decode takes it
                heapq.heappop(queue)
                out.embeds.append(task.job)
                continue
            group = self._place(task, free, batch_busy)
            if group is None:
                break
            heapq.heappop(queue)
            if task.job.priority == Priority.BATCH:
                batch_busy += len(group)
            for slot in group:
                free.remove(slot)
            out.starts.append((task, group))
        return out

    def _fits_embed_round(self, round_: _EmbedRound, job: Job, *, first: bool) -> bool:
        """Count `job`'s inputs into this round's embeddings decode; False when they would
        take it past its tokens or sequences (the first request of a round always goes)."""
        round_.tokens += sum(len(p) for p in job.prompts)
        round_.seqs += len(job.prompts)
        over = (self.embed_tokens and round_.tokens > self.embed_tokens) or (
            self.embed_seqs and round_.seqs > self.embed_seqs
        )
        return first or not over

    def _place(self, task: Task, free: list[Slot], batch_busy: int) -> list[Slot] | None:
        """The slots `task` takes, its leader first, or None when it must wait: too few
        free slots, or a batch line past the batch room while other batch lines run."""
        want = len(task.choice_indices)
        if want > len(free):
            return None
        # llama.cpp cuts a batch over separate KV streams into one forward pass per run of
        # consecutive sequence ids, so batch lines keep to the lowest slots and online
        # requests take the highest first: then the sequences of a step form one run.
        if task.job.priority == Priority.BATCH:
            if batch_busy + want > self.batch_room and batch_busy > 0:
                return None  # online tasks sort first, so nothing behind this one may go either
            pool = [s for s in free if s.seq_id < self.batch_room]
        else:
            pool = [s for s in free if s.seq_id >= self.batch_room]
        if len(pool) < want:
            pool = list(free)
        leader = self._leader(task, pool)
        pool.remove(leader)
        # Siblings (n > 1) get a full copy of the leader's stream, so their caches go.
        pool.sort(key=lambda s: len(s.cached))
        return [leader] + [pool.pop(0) for _ in task.choice_indices[1:]]

    @staticmethod
    def _leader(task: Task, pool: list[Slot]) -> Slot:
        """The slot of `pool` that evaluates `task`'s prompt.

        The free slot that already holds the longest prefix of the prompt; ties go to the
        slot with the least cached, so longer caches survive, and for batch lines to the
        lowest slot: lines admitted together then sit in a run of consecutive sequences,
        whose prompts llama.cpp cuts into full micro-batches.
        """
        prompt = task.job.prompts[task.prompt_index]
        if task.job.priority == Priority.BATCH:
            return max(pool, key=lambda s: (common_prefix(s.cached, prompt), -s.seq_id))
        return max(pool, key=lambda s: (common_prefix(s.cached, prompt), -len(s.cached)))

    def prompt_budget(self, slots: list[Slot], n_batch: int) -> int:
        """Prompt tokens this step may take, besides one row per generating slot."""
        generating = sum(1 for s in slots if s.generating)
        online = any(s.job is not None and s.job.priority == Priority.ONLINE for s in slots)
        cap = PROMPT_TOKENS_PER_STEP if online else BATCH_PROMPT_TOKENS_PER_STEP
        return max(0, min(n_batch - generating, cap))

    def held_back(self, slots: list[Slot]) -> set[int]:
        """The batch slots that sit this step out so that an online request decodes quickly."""
        if not any(s.job is not None and s.job.priority == Priority.ONLINE for s in slots):
            return set()
        batch_slots = [
            s.seq_id for s in slots if s.job is not None and s.job.priority == Priority.BATCH
        ]
        if len(batch_slots) <= ONLINE_BATCH_WINDOW:
            return set()
        # Windows of consecutive slots in turn: each step stays one run of sequence ids.
        self.window = (self.window + 1) % -(-len(batch_slots) // ONLINE_BATCH_WINDOW)
        start = self.window * ONLINE_BATCH_WINDOW
        return set(batch_slots[:start] + batch_slots[start + ONLINE_BATCH_WINDOW :])

    def prefix_source(
        self, slot: Slot, prompt: list[int], slots: list[Slot], copy_pending: set[int]
    ) -> tuple[Slot | None, int]:
        """Where `slot`'s KV for `prompt` comes from: (a slot to copy the stream of, or None
        to keep its own) and how many prompt tokens it then holds already.

        Always leaves at least the last prompt token to evaluate: the first sampled token
        needs its logits. A slot whose own stream copy is still queued (`copy_pending`) is
        no source until the next decode has done it.
        """
        limit = len(prompt) - 1 if self.prefix_cache else 0
        own = min(common_prefix(slot.cached, prompt), limit)
        best, source = own, None
        for other in slots:
            if other is slot or other.seq_id in copy_pending:
                continue
            shared = min(common_prefix(other.cached, prompt), limit)
            if shared > best:
                best, source = shared, other
        if source is not None and best >= own + MIN_COPY_TOKENS:
            return source, best
        return None, own
