"""Slots and the scheduling decisions of the engine's loop, without llama.cpp.

A `Job` (jobs.py) is one submitted request; its prompts become `Task`s on a priority queue; a
`Seq` is one llama.cpp sequence and the choice decoding in it. The `Scheduler` decides which tasks
take which free slots, which batch slots sit a step out while an online request decodes,
and which slot's cached KV a new prompt starts from. The slots' context (slots_context.py) carries
the decisions out on the llama.cpp context.
"""

from __future__ import annotations

import codecs
import enum
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from app.catalog.estimate import ONLINE_SEQUENCES
from app.engine.base import Priority
from app.engine.llama.binding.sampler import StopMatcher
from app.engine.llama.jobs.block import Block
from app.engine.llama.jobs.jobs import Choice, Job, Task
from app.wire.endpoints import EMBEDDINGS

#: Prompt tokens admitted per step while an online request decodes. Bounded so that a long
#: new prompt delays the online tokens by one ubatch at most, not by its whole length.
PROMPT_TOKENS_PER_STEP = 512
#: Prompt tokens admitted per step when only batch lines run: the prompts of many new lines
#: go into one step, and llama.cpp cuts runs of them into full micro-batches (equal chunks of
#: consecutive sequences), rather than a prompt or two a step (bench/README.md).
BATCH_PROMPT_TOKENS_PER_STEP = 2048
#: While an online request decodes, each step takes at most this many batch sequences, in
#: turns: a step's cost grows with its rows, and the online tokens should not wait for 31.
ONLINE_BATCH_WINDOW = 8
#: A new prompt copies another slot's KV stream when that shares at least this many more
#: prompt tokens than the slot it lands in. Copying a stream moves the whole ctx_size
#: buffer, which costs about as much as evaluating a few tokens in a batched step.
MIN_COPY_TOKENS = 8
#: Prompts are compared for admission in chunks of this many tokens (`chunk_keys`): cheap
#: enough to look at every queued line in the window against every slot each round.
PREFIX_CHUNK = 16
#: A batch line waits for a prompt that is being evaluated when it shares at least this many
#: more chunks with it than with any KV already computed: one step's wait, then it forks
#: from that KV, instead of computing the shared part again beside it (an instruction block
#: on every line of a file: `throughput.py --workload shared`). One chunk of 16 tokens is
#: enough: a chat template's own system prompt (SmolLM2's, 24 tokens) on every line of a
#: file's first wave was computed once a slot; a 24-line SmolLM2 batch, 8 slots: 414 then
#: 560 of 985 prompt tokens cached, 1.83 then 1.64 s (bench/README.md).
MIN_WAIT_CHUNKS = 1
#: Queued batch lines the admission weighs at once, as a multiple of the slots: it starts
#: the ones whose prompt shares the longest prefix with KV already computed first
#: (longest-prefix-match order, as SGLang's scheduler), not strictly in file order.
LOOKAHEAD_PER_SLOT = 4


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    n = min(len(a), len(b))
    i = 0
    # Whole chunks first: list slices compare in C, a token at a time in Python is slow.
    while i + PREFIX_CHUNK <= n and a[i : i + PREFIX_CHUNK] == b[i : i + PREFIX_CHUNK]:
        i += PREFIX_CHUNK
    while i < n and a[i] == b[i]:
        i += 1
    return i


def chunk_keys(tokens: list[int]) -> list[int]:
    """One key per whole PREFIX_CHUNK of `tokens`, each standing for the prefix up to its end:
    two prompts share their first k keys when they share their first k chunks."""
    keys, key = [], 0
    for i in range(PREFIX_CHUNK, len(tokens) + 1, PREFIX_CHUNK):
        key = hash((key, tuple(tokens[i - PREFIX_CHUNK : i])))
        keys.append(key)
    return keys


def leading(keys: list[int], known: set[int]) -> int:
    """How many of `keys`, from the first, are in `known`."""
    n = 0
    for key in keys:
        if key not in known:
            break
        n += 1
    return n


class SeqState(enum.Enum):
    """Where a slot's sequence is (llama.cpp server's slot_state, the states batchyard has)."""

    IDLE = "idle"  # no request; its KV stays as a cache for later prompts
    PROMPT = "prompt"  # its prompt is being evaluated, in chunks (slot.pending)
    WAIT_LEADER = "wait_leader"  # a sibling choice (n > 1) waiting for the leader's prompt KV
    GENERATING = "generating"  # slot.token is the last sampled token, fed in the next step


# Read on every slot every step: module names are cheaper to reach than enum members.
_IDLE, _GENERATING = SeqState.IDLE, SeqState.GENERATING


class Seq:
    """One llama.cpp sequence (seq_id) and the choice decoding in it: a slot of the slots'
    context, or a branch of the shared-prefix context."""

    def __init__(self, seq_id: int, ctx: Any = None) -> None:
        self.seq_id = seq_id
        self.ctx = ctx  # the llama context the sequence lives in (its logits, its sampler's)
        # The tokens whose KV this sequence holds, at positions 0.. in order. They outlive the
        # request (like llama.cpp server's cache_prompt): the next prompt sharing a prefix with
        # them only evaluates the rest.
        self.cached: list[int] = []
        self.clear()

    def clear(self) -> None:
        self.state = SeqState.IDLE
        self.job: Job | None = None
        self.choice: Choice | None = None
        self.pending: list[int] = []  # prompt tokens not yet decoded
        self.pos = 0  # the next position of this sequence (its KV cells, less `shift`)
        # KV cells beyond `pos`: an M-RoPE image takes fewer positions than rows (rows.py).
        self.shift = 0
        self.prompt_len = 0
        self.sampler: Any = None
        # Its answer's grammar (grammars.py; None: unconstrained), and the tokens it forced
        # after `token`, fed with it in the next step.
        self.matcher: Any = None
        self.forced: list[int] = []
        self.token = -1  # the last sampled token, fed in the next step
        self.i_batch = -1  # row of logits to sample after this step's decode
        self.followers: list[Seq] = []  # slots that get a copy of this prompt's KV (n > 1)
        self.leader: Seq | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops: StopMatcher = StopMatcher([])
        self.max_tokens = 0
        # A branch of the shared-prefix context (shared.py): the block it forked from, and
        # the KV cells it may take beyond it (its prompt's rest and its longest answer).
        self.block: Block | None = None
        self.reserved = 0

    def take(
        self, job: Job, choice: Choice, prompt_len: int, leader: Seq | None, *, ctx_per_slot: int
    ) -> None:
        """Start a choice here: as the leader that evaluates the prompt, or as its follower."""
        self.clear()
        self.job, self.choice, self.prompt_len = job, choice, prompt_len
        self.stops = StopMatcher(job.stop_strings)
        cells_left = ctx_per_slot - prompt_len
        self.max_tokens = min(job.params.max_tokens or cells_left, cells_left)
        if leader is None:
            self.state = SeqState.PROMPT
        else:
            self.state = SeqState.WAIT_LEADER
            self.leader = leader
            leader.followers.append(self)

    def generate(self, token: int) -> None:
        """The sampled token goes into the next step."""
        self.token = token
        self.state = SeqState.GENERATING

    @property
    def busy(self) -> bool:
        return self.state is not _IDLE

    @property
    def generating(self) -> bool:
        return self.state is _GENERATING


class SharedStart(Protocol):
    """A line the shared context's round starts (shared.py's Start), as admission sees it."""

    @property
    def task(self) -> Task: ...


class SharedRoundView(Protocol):
    """What the admission reads of the shared context's round (shared.py's SharedRound)."""

    @property
    def starts(self) -> Sequence[SharedStart]: ...

    held: set[int]  # id() of the tasks that run there or wait for it


#: The shared context's round, as its admission gives it (shared.py's SharedRound): the
#: Scheduler hands it on, whole, to the loop that carries it out (shared_context.py).
Round = TypeVar("Round", bound=SharedRoundView)
Round_co = TypeVar("Round_co", bound=SharedRoundView, covariant=True)


class SharedAdmission(Protocol[Round_co]):
    """The shared-prefix context's admission (shared.py's SharedBlocks), as slots.py sees
    it: shared.py builds on this module, so it is named by what it does."""

    def decide(
        self, window: list[Task], branches: list[Seq], others: list[list[int]]
    ) -> Round_co: ...


@dataclass
class Admission(Generic[Round]):
    """What one admission round decided: tasks with their slots (leader first), embeddings,
    and the shared context's round (None: it has none, or batch lines did not head the
    queue)."""

    starts: list[tuple[Task, list[Seq]]] = field(default_factory=list)
    embeds: list[Job] = field(default_factory=list)
    shared: Round | None = None


@dataclass
class _EmbedRound:
    """The inputs of the embeddings decode one admission round fills."""

    tokens: int = 0
    seqs: int = 0


def _embed_tokens(job: Job) -> int:
    """The tokens of an embeddings request's inputs."""
    return sum(len(p) for p in job.prompts)


def _keys(task: Task) -> list[int]:
    """`chunk_keys` of a task's prompt, computed once."""
    if task.prefix_keys is None:
        task.prefix_keys = chunk_keys(task.job.prompts[task.prompt_index])
    return task.prefix_keys


class Scheduler(Generic[Round]):
    """The loop's decisions: admission, the online window, and where a prompt's KV comes from."""

    def __init__(
        self,
        n_slots: int,
        *,
        prefix_cache: bool = True,
        embed_tokens: int = 0,
        embed_seqs: int = 0,
        shared: SharedAdmission[Round] | None = None,
        branches: list[Seq] | None = None,
    ) -> None:
        self.n_slots = n_slots
        self.prefix_cache = prefix_cache
        # The shared-prefix context (shared.py) and its branches, where the model has one.
        self.shared = shared
        self.branches = branches or []
        self.lookahead = LOOKAHEAD_PER_SLOT * n_slots + len(self.branches)
        # One embeddings decode's worth of inputs (0: no bound): each admission round hands
        # over the queued embedding requests that fill one decode together, so a batch's
        # lines share decodes instead of taking one each.
        self.embed_tokens = embed_tokens
        self.embed_seqs = embed_seqs
        # One sequence is kept from batch lines, so an online request never waits for a
        # batch line to finish (they run to max_tokens); with a single one nothing is kept.
        # The engine's context has it besides the --parallel slots (catalog/estimate.py's context_sequences).
        self.batch_seqs = n_slots - ONLINE_SEQUENCES if n_slots > 1 else 1
        self.window = 0  # the batch slots' turn while online requests decode (held_back)

    def admit(self, queue: list[Task], slots: list[Seq]) -> Admission[Round]:
        """Pop the tasks that fit into free slots off the heap `queue`, highest priority first.

        Strict order: the head of the queue waits (and so does everything behind it) when
        it does not fit, rather than be overtaken. Three rules decide: embeddings fill one
        decode (`_fits_embed_round`), a task takes its pool of free slots (`_place`), and
        its prompt lands where its prefix is cached (`_leader`). Batch lines, once they head
        the queue, go by what they share instead (`_admit_batch`).
        """
        out: Admission[Round] = Admission()
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
                    self._fill_embed_round(queue, embeds, out)
                    break  # the next round's decode takes it
                heapq.heappop(queue)
                out.embeds.append(task.job)
                continue
            if task.job.priority == Priority.BATCH and self.prefix_cache:
                self._admit_batch(queue, slots, free, batch_busy, out)
                break
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

    def _admit_batch(
        self,
        queue: list[Task],
        slots: list[Seq],
        free: list[Seq],
        batch_busy: int,
        out: Admission[Round],
    ) -> None:
        """Start the batch lines of the queue's first window that fit, longest cached prefix
        first; a line waits while a prompt it shares more with is being evaluated.

        So each shared block is computed once, then forked (prefix_source), and the lines of
        a file mixing several blocks run with the block that is already cached.
        """
        window = [
            t
            for t in heapq.nsmallest(self.lookahead, queue)
            if t.job.endpoint != EMBEDDINGS and not t.job.cancelled
        ]
        started: set[int] = set()
        if self.shared is not None:
            # Lines that share a long block go to the shared context, or wait for it.
            others = [s.cached + s.pending for s in slots if s.cached or s.pending]
            shared = self.shared.decide(window, self.branches, others)
            out.shared = shared
            started.update(id(start.task) for start in shared.starts)
            window = [t for t in window if id(t) not in shared.held]
        known: set[int] = set()  # prefixes whose KV some slot holds
        coming: set[int] = set()  # prefixes of the prompts being evaluated
        for slot in slots:
            known.update(chunk_keys(slot.cached))
            if slot.pending:
                coming.update(chunk_keys(slot.cached + slot.pending))
        ranked = sorted(window, key=lambda t: (-leading(_keys(t), known), t.seq_no))
        for task in ranked:
            keys = _keys(task)
            if leading(keys, coming) >= leading(keys, known) + MIN_WAIT_CHUNKS:
                continue  # it forks from that prompt's KV once it is computed
            group = self._place(task, free, batch_busy)
            if group is None:
                break
            batch_busy += len(group)
            for slot in group:
                free.remove(slot)
            out.starts.append((task, group))
            started.add(id(task))
            coming.update(keys)
        if started:
            queue[:] = [t for t in queue if id(t) not in started]
            heapq.heapify(queue)

    def _fits_embed_round(self, round_: _EmbedRound, job: Job, *, first: bool) -> bool:
        """Count `job`'s inputs into this round's embeddings decode; False (counting nothing)
        when they would take it past its tokens or sequences (the first request of a round
        always goes)."""
        tokens = round_.tokens + _embed_tokens(job)
        seqs = round_.seqs + len(job.prompts)
        over = (self.embed_tokens and tokens > self.embed_tokens) or (
            self.embed_seqs and seqs > self.embed_seqs
        )
        if over and not first:
            return False
        round_.tokens, round_.seqs = tokens, seqs
        return True

    def _fill_embed_round(
        self, queue: list[Task], round_: _EmbedRound, out: Admission[Round]
    ) -> None:
        """Fill the rest of the round's decode from the embedding requests that head the
        queue (up to the lookahead), longest first, as llama-server fills its ubatch from
        any slot whose prompt fits; the head itself stays first for the next round, so
        none waits more than the lookahead's rounds."""
        window: list[Task] = []
        while queue and len(window) < self.lookahead:
            task = queue[0]
            if not task.job.cancelled and task.job.endpoint != EMBEDDINGS:
                break
            heapq.heappop(queue)
            if not task.job.cancelled:
                window.append(task)
        for task in sorted(window, key=lambda t: -_embed_tokens(t.job)):
            if self._fits_embed_round(round_, task.job, first=False):
                out.embeds.append(task.job)
            else:
                heapq.heappush(queue, task)

    def _place(self, task: Task, free: list[Seq], batch_busy: int) -> list[Seq] | None:
        """The slots `task` takes, its leader first, or None when it must wait: too few
        free slots, or a batch line past the batch sequences while other batch lines run."""
        want = len(task.choice_indices)
        if want > len(free):
            return None
        # llama.cpp cuts a batch over separate KV streams into one forward pass per run of
        # consecutive sequence ids, so batch lines keep to the lowest slots and online
        # requests take the highest first: then the sequences of a step form one run.
        if task.job.priority == Priority.BATCH:
            if batch_busy + want > self.batch_seqs and batch_busy > 0:
                return None  # online tasks sort first, so nothing behind this one may go either
            pool = [s for s in free if s.seq_id < self.batch_seqs]
        else:
            pool = [s for s in free if s.seq_id >= self.batch_seqs]
        if len(pool) < want:
            pool = list(free)
        leader = self._leader(task, pool)
        pool.remove(leader)
        # Siblings (n > 1) get a full copy of the leader's stream, so their caches go.
        pool.sort(key=lambda s: len(s.cached))
        return [leader] + [pool.pop(0) for _ in task.choice_indices[1:]]

    @staticmethod
    def _leader(task: Task, pool: list[Seq]) -> Seq:
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

    def prompt_budget(self, slots: list[Seq], n_batch: int) -> int:
        """Prompt tokens this step may take, besides one row per generating slot."""
        generating = sum(1 for s in slots if s.generating)
        online = any(s.job is not None and s.job.priority == Priority.ONLINE for s in slots)
        cap = PROMPT_TOKENS_PER_STEP if online else BATCH_PROMPT_TOKENS_PER_STEP
        return max(0, min(n_batch - generating, cap))

    def held_back(self, slots: list[Seq]) -> set[int]:
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
        self, slot: Seq, prompt: list[int], slots: list[Seq], copy_pending: set[int]
    ) -> tuple[Seq | None, int]:
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
