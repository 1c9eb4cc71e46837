"""What the loop does to a sequence of either context: a choice taken with its sampler, a
step's rows filled, each row of logits sampled and streamed, the choice finished and its
sequence let go.

The slots' context (slots_context.py) and the shared-prefix context (shared_context.py)
each decode their own sequences, both `Seq`s (slots.py); what happens to a sequence before
and after a decode is the same in both, and lives here. The engine (engine.py) owns the
jobs: `settle` resolves a job's future once.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

# libgomp's spin settings come from app/__init__.py, which runs before llama_cpp loads.
import llama_cpp as lc
import numpy as np

from app.catalog.estimate import N_UBATCH
from app.engine.base import EngineError
from app.engine.counters import Counters
from app.engine.llama.binding import native
from app.engine.llama.binding.grammars import Grammars, accept, forced
from app.engine.llama.binding.sampler import build_sampler, free_sampler, top_logprobs_of
from app.engine.llama.contexts.slots import Seq
from app.engine.llama.jobs.jobs import Choice, Job, Task
from app.engine.llama.jobs.oai import answers, media

log = logging.getLogger("batchyard.engine")

#: The log-probability OpenAI gives a token its structured output's grammar rules out.
MASKED_LOGPROB = -9999.0


class Settle(Protocol):
    """Forget a job and resolve its future once (the engine's); True when this call did."""

    def __call__(
        self, job: Job, *, result: dict[str, Any] | None = None, error: BaseException | None = None
    ) -> bool: ...


def decode_failed(rc: int) -> EngineError:
    """The error of a request whose llama_decode failed."""
    return EngineError(
        f"llama_decode failed ({rc}).", status_code=500, code="decode_failed", type="server_error"
    )


def equal_ahead(slots: list[Seq], held: set[int], budget: int) -> tuple[int, int]:
    """How many forced tokens each generating slot feeds after its sampled one this step
    where every slot is a KV stream of its own, and how many that makes in all: the same
    number for all, the fewest any of them has. llama.cpp cuts such a batch into ubatches
    of consecutive sequences that each bring the same count of tokens, so unequal chunks
    would add a ubatch per run length (extraction, 64 lines, 32 slots, 2 cores: decode 57 s
    against 40 s one a step, bench/README.md), while equal ones add none: a request decoding
    alone (an online one, or a batch's last lines) takes its forced tokens in one decode."""
    generating = [s for s in slots if s.generating and s.seq_id not in held]
    if not generating:
        return 0, 0
    fewest = min(len(s.forced) for s in generating)
    k = max(0, min(fewest, budget // len(generating), N_UBATCH // len(generating) - 1))
    return k, k * len(generating)


def fill_rows(
    slots: list[Seq], batch: Any, n: int, budget: int, held: set[int], *, streams: bool = False
) -> int:
    """Rows of `batch` from row `n` on: a token per generating slot and the tokens its
    grammar forced after it (`streams`: as many as every generating slot has, equal_ahead),
    then prompt chunks up to `budget` tokens; returns the count."""
    add = native.batch_add
    # Taken out of the budget first: a prompt in an earlier slot must leave them room.
    equal, reserved = equal_ahead(slots, held, budget) if streams else (None, 0)
    budget -= reserved
    # Sequences go in seq_id order: llama.cpp splits a multi-stream batch into ubatches of
    # consecutive sequence ids, so order keeps a step to as few ubatches as possible.
    for slot in slots:
        slot.i_batch = -1
        if slot.seq_id in held:
            continue  # a batch line sits this step out; its next token waits in slot.token
        if slot.generating:
            # The sampled token, then the tokens its grammar forced after it (as far as the
            # budget goes: the rest wait for the next step, with no row of logits now).
            if equal is None:
                ahead = slot.forced[: max(budget, 0)]
                budget -= len(ahead)
            else:
                ahead = slot.forced[:equal]
            chunk = [slot.token, *ahead]
            rest = slot.forced[len(ahead) :]
            for j, token in enumerate(chunk):
                last = not rest and j == len(chunk) - 1
                n = add(batch, n, token, slot.pos, slot.seq_id, last)
                slot.pos += 1
            slot.cached.extend(chunk)
            if rest:
                slot.token, slot.forced = rest[0], rest[1:]
            else:
                slot.forced = []
                slot.i_batch = n - 1
        elif slot.pending and budget > 0:
            take = min(len(slot.pending), budget)
            if slot.job is not None and slot.job.images:
                take = media.text_run(slot.pending, take)
                if not take:
                    continue  # its next chunk is an image (SlotsContext.decode_images)
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


def _closing(job: Job, choice: Choice) -> list[int]:
    """The tokens that close the choice's thought now (its budget is spent), or none."""
    thought, budget = choice.thought, job.thought_budget
    if thought is None or budget is None or not thought.thinking or thought.inside < budget:
        return []
    return job.thought_close


class Sequences:
    """Choices in sequences, from the take to the release, and the answers they stream."""

    def __init__(
        self,
        vocab: native.Vocab,
        *,
        ctx_per_slot: int,
        counters: Counters,
        fingerprint: str,
        settle: Settle,
        shared_mem: Any = None,
        grammars: Grammars | None = None,
    ) -> None:
        self.vocab = vocab
        # Constrained sequences' matchers and masks (grammars.py); its tokenizer is built
        # when a job with a grammar is prepared (prepare.py).
        self.grammars = grammars or Grammars(vocab)
        self.n_vocab = vocab.n_vocab
        self.ctx_per_slot = ctx_per_slot
        self.counters = counters
        self.fingerprint = fingerprint
        self.settle = settle
        # The shared-prefix context's KV (None: the model has none): a branch let go
        # gives its own cells back there.
        self.shared_mem = shared_mem

    def take(self, slot: Seq, task: Task, index: int, leader: Seq | None) -> None:
        """Start choice `index` of `task` in `slot`, with its sampler."""
        job = task.job
        prompt_len = len(job.prompts[task.prompt_index])
        slot.take(job, job.choices[index], prompt_len, leader, ctx_per_slot=self.ctx_per_slot)
        if job.params.grammar is not None:
            slot.matcher = self.grammars.matcher(job.params.grammar)
        # Plain greedy takes the argmax itself (sample) and needs no sampler chain.
        if not job.params.plain_greedy:
            slot.sampler = build_sampler(
                job.params,
                self.n_vocab,
                job.params.choice_seed(index),
                self.ctx_per_slot,
            )

    def sample_rows(self, slots: list[Seq]) -> None:
        """Sample every slot that has a row of logits this step, the constrained ones'
        logits masked first, all together; count the tokens (forced ones too)."""
        rows = [s for s in slots if s.i_batch >= 0 and s.job is not None]
        constrained = [(s.matcher, s.ctx, s.i_batch) for s in rows if s.matcher is not None]
        if constrained:
            self.grammars.mask(constrained)
        self.counters.tokens(completion=sum(self.sample(slot) for slot in rows))

    def sample(self, slot: Seq) -> int:
        """Sample the slot's row and take the token (and those its grammar forces after
        it) into the answer; returns how many tokens the answer gained."""
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        closing = _closing(job, choice)
        # The thought spent its budget: the tokens that close it, as llama.cpp's reasoning
        # budget forces them, and the answer follows.
        token = closing[0] if closing else self._pick(slot)
        matcher = slot.matcher
        if self.vocab.is_eog(token) or (matcher is not None and not accept(matcher, token)):
            self.finish(slot, "stop")
            return 0
        if job.params.logprobs:
            self._record_logprob(slot, token, self.vocab.piece(token))
        ahead = self._ahead(slot, closing[1:] if closing else None)
        taken = 0
        for t in (token, *ahead):
            taken += 1
            choice.completion_tokens += 1
            choice.tokens.append(t)
            self._take_text(job, choice, slot, t)
            if slot.stops.stopped:
                break
        if slot.stops.stopped or (matcher is not None and matcher.is_stopped()):
            # A stop string, or the grammar's end: nothing but the end of the answer may follow.
            self.finish(slot, "stop")
        elif (
            choice.completion_tokens >= slot.max_tokens
            or slot.pos + slot.shift + len(ahead) >= self.ctx_per_slot
        ):
            self.finish(slot, "length")
        else:
            slot.generate(token)
            slot.forced = ahead
        return taken

    def _pick(self, slot: Seq) -> int:
        """The token sampled from the slot's row of logits."""
        assert slot.job is not None
        if slot.job.params.plain_greedy:
            # The argmax of the row, as llama.cpp's greedy sampler picks it (first of equals),
            # without building its candidate array over the whole vocabulary.
            return int(native.logits_row(slot.ctx, slot.i_batch, self.n_vocab).argmax())
        return int(lc.llama_sampler_sample(slot.sampler, slot.ctx, slot.i_batch))

    def _ahead(self, slot: Seq, closing: list[int] | None) -> list[int]:
        """The tokens that follow the sampled one at once: the rest of a thought's closing
        tag (`closing`), or what the grammar forces; each taken into the matcher."""
        job, choice, matcher = slot.job, slot.choice, slot.matcher
        assert job is not None and choice is not None
        if matcher is None:
            return closing or []
        if closing is not None:
            ahead = closing
        elif not job.params.logprobs and not matcher.is_stopped():
            # Forced tokens have no row of logits, so no logprobs: with logprobs asked for,
            # each is sampled (the mask leaves it the only choice).
            room = min(
                slot.max_tokens - choice.completion_tokens - 1,
                self.ctx_per_slot - (slot.pos + slot.shift) - 1,
            )
            ahead = forced(matcher)[: max(room, 0)]
        else:
            return []
        if ahead and not matcher.consume_tokens(ahead):
            return []  # not expected: the grammar offered them
        return ahead

    def _take_text(self, job: Job, choice: Choice, slot: Seq, token: int) -> None:
        """One token's text into the answer: a thinking model's thought apart (streamed as
        its own deltas), the rest through the stop strings into the text."""
        thought = choice.thought
        special = thought is not None and token in job.thought_close
        text = slot.decoder.decode(self.vocab.piece(token, special))
        if thought is not None:
            inner, answer = thought.feed(text)
            if not job.thought_inline:  # else the whole text stays in the answer
                text = answer
                self._take_thought(job, choice, inner)
        text = slot.stops.feed(text)
        if text:
            choice.text += text
            self.emit(job, choice, text)

    def _take_thought(self, job: Job, choice: Choice, text: str) -> None:
        if text:
            choice.reasoning += text
            self.emit(job, choice, text, thought=True)

    def _record_logprob(self, slot: Seq, token: int, piece: bytes) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        logp, top = top_logprobs_of(
            lc.llama_get_logits_ith(slot.ctx, slot.i_batch), self.n_vocab, job.params.top_logprobs
        )
        # A token the grammar masked has no probability: OpenAI shows it as -9999.0 (JSON
        # has no -Infinity).
        logp = np.maximum(logp, MASKED_LOGPROB)
        alternatives = [(self.vocab.piece(t), float(logp[t])) for t in top]
        choice.logprobs.append(answers.token_logprob(piece, float(logp[token]), alternatives))

    def finish(self, slot: Seq, reason: str) -> None:
        job, choice = slot.job, slot.choice
        assert job is not None and choice is not None
        tail = slot.decoder.decode(b"", final=True)
        thought = choice.thought
        if thought is not None and not job.thought_inline:
            # What the split held back: a thought cut off stays the thought, never the answer.
            inner, tail = thought.finish(tail)
            self._take_thought(job, choice, inner)
        tail = slot.stops.feed(tail) + slot.stops.flush()
        if tail:
            choice.text += tail
            self.emit(job, choice, tail)
        choice.finish_reason = reason
        self.emit(job, choice, None)
        self.release(slot)
        job.unfinished -= 1
        if job.unfinished == 0:
            self.complete(job)

    def release(self, slot: Seq) -> None:
        """Let a sequence go: its sampler freed, its choice forgotten."""
        for follower in slot.followers:  # siblings still waiting for this prompt lose their source
            if follower.job is not None and follower.job.cancelled:
                self.release(follower)
        free_sampler(slot.sampler)
        if slot.block is not None:
            # A branch: its own cells go at once; its block's stay for the other branches.
            assert self.shared_mem is not None
            lc.llama_memory_seq_rm(self.shared_mem, slot.seq_id, -1, -1)
            slot.block.users -= 1
            slot.cached = []
        # The KV stays, and slot.cached says what it holds, for a later prompt to reuse.
        slot.clear()

    def complete(self, job: Job) -> None:
        model, fp = job.model, self.fingerprint
        if job.on_chunk and job.include_usage:
            self._call_chunk(job, answers.usage_chunk(job, model, fp))
        if self.settle(job, result=answers.completion(job, model, fp)):
            self.counters.count("succeeded")

    def emit(self, job: Job, choice: Choice, text: str | None, *, thought: bool = False) -> None:
        """Stream one delta (text; with `thought`, of the thought) or the closing chunk
        (None) of a choice."""
        if job.on_chunk is None:
            return
        chunks = answers.choice_chunks(job, choice, text, job.model, self.fingerprint, thought)
        for chunk in chunks:
            self._call_chunk(job, chunk)
        choice.started = True

    def _call_chunk(self, job: Job, chunk: dict[str, Any]) -> None:
        assert job.on_chunk is not None
        try:
            job.on_chunk(chunk)
        except Exception:  # a broken stream consumer must not stop the other sequences
            log.exception("on_chunk callback failed for %s", job.id)
