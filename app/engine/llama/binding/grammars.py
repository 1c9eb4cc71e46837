"""The grammar of a structured answer at work on a model: llguidance's tokenizer for its
vocabulary, a matcher per constrained sequence, and each step's masks on the logits.

Each step the masks of all constrained rows are computed together, in llguidance's own
threads with the GIL released (`LLExecutor`, on a machine with cores to spare), and put on
their rows of logits before any sampler reads them; a sequence without a grammar pays
nothing. The sampled token goes into its matcher; where the grammar then allows one
continuation only (a key, punctuation, the rest of an enum value), `forced` gives its
canonical tokens, which the answer takes at once and the sequence feeds without a mask or a
sample: as a chunk in its next decode in the shared-prefix context (one KV stream), in
chunks of the same length for every generating slot in the slots' (a stream each:
sequences.equal_ahead). The compiled grammars come from engine/structured.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from typing import Any

import llama_cpp as lc
import numpy as np

from app.engine.base import EngineError
from app.engine.llama.binding import native

log = logging.getLogger("batchyard.engine")

#: CPUs from which a step's masks are computed in llguidance's own threads (LLExecutor, the
#: GIL released); below, the loop's thread computes them one after another (each call still
#: releases the GIL). On 2 cores the executor's idle threads took cycles from llama.cpp's:
#: extraction, 64 lines, 32 slots, decode 195 against 158-172 ms a step (bench/README.md).
PARALLEL_MASK_CPUS = 8


class Grammars:
    """One model's llguidance tokenizer (built once, on the first structured request: about
    a second for a 49k vocabulary, several for 262k) and the step's masks."""

    def __init__(self, vocab: native.Vocab) -> None:
        self.vocab = vocab
        self.n_vocab = vocab.n_vocab
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._executor: Any = None

    def ready(self) -> None:
        """Build the tokenizer (in the preparing thread: check), so the loop never waits."""
        if self._tokenizer is not None:
            return
        with self._lock:
            if self._tokenizer is not None:
                return
            from llguidance import LLExecutor
            from llguidance.llamacpp import lltokenizer_from_vocab

            ptr = self.vocab.ptr
            # Every end-of-generation token ends an answer the grammar accepts (Gemma's
            # <end_of_turn> as well as <eos>), so none is masked away at the end.
            eog = [t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(ptr, t)]
            if len(os.sched_getaffinity(0)) >= PARALLEL_MASK_CPUS:
                self._executor = LLExecutor()
            with warnings.catch_warnings():
                # It reads each token's attributes by llama.cpp's older name.
                warnings.simplefilter("ignore", DeprecationWarning)
                self._tokenizer = lltokenizer_from_vocab(ptr, eos_token=eog or None)

    def tag(self, text: str) -> str | None:
        """A thought's tag (`</think>`, gpt-oss's `<|end|><|start|>assistant...`) as a Lark
        expression of its tokens, where llguidance holds any of them as a special token (a
        control token, or a user-defined one spelled `<...>`): those can only be named by id
        (`<[ID]>`), never matched as text. None: the tag is plain text to the grammar."""
        out, special = [], False
        for token in self.vocab.tokenize(text, add_special=False):
            attr = lc.llama_vocab_get_attr(self.vocab.ptr, token)
            piece = self.vocab.piece(token, True)
            user = (
                attr & lc.LLAMA_TOKEN_ATTR_USER_DEFINED and piece[:1] == b"<" and piece[-1:] == b">"
            )
            if attr & lc.LLAMA_TOKEN_ATTR_CONTROL or user:
                out.append(f"<[{token}]>")
                special = True
            else:
                out.append(json.dumps(piece.decode("utf-8", "replace")))
        return " ".join(out) if special else None

    def check(self, grammar: str) -> None:
        """Raise the 400 of a grammar the model's vocabulary cannot run (prepare.py)."""
        self.matcher(grammar)

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for one sequence (compiling is lazy: about a millisecond)."""
        from llguidance import LLMatcher

        self.ready()
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise EngineError(
                f"The grammar cannot be used: {matcher.get_error()}",
                status_code=400,
                param="response_format",
                code="unsupported_schema",
            )
        return matcher

    def mask(self, rows: list[tuple[Any, Any, int]]) -> None:
        """Put each (matcher, ctx, row) mask on that row of the last decode's logits:
        every token the grammar does not allow next becomes -inf."""
        words = (self.n_vocab + 31) // 32
        bitmask = np.zeros((len(rows), words), dtype=np.int32)
        if self._executor is not None and len(rows) > 1:
            self._executor.unsafe_compute_mask_ptr(
                [(m, i) for i, (m, _, _) in enumerate(rows)],
                bitmask.ctypes.data,
                words * 4,
                len(rows),
            )
        else:
            for i, (m, _, _) in enumerate(rows):
                m.unsafe_compute_mask_ptr(bitmask[i].ctypes.data, words * 4)
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
        for i, (_, ctx, row) in enumerate(rows):
            # putmask: the fastest of numpy's ways here (a mask mostly of zeros, as in JSON's
            # punctuation, or mostly of ones, inside a string).
            logits = native.logits_row(ctx, row, self.n_vocab)
            np.putmask(logits, bits[i, : self.n_vocab] == 0, -np.inf)


#: Feed forced tokens as a chunk (False: each is sampled in a step of its own, the mask
#: leaving it the only choice; the tests compare both).
FEED_FORCED = True


def forced(matcher: Any) -> list[int]:
    """The canonical tokens the grammar forces next (none: the model chooses)."""
    if not FEED_FORCED:
        return []
    tokens: list[int] = matcher.compute_ff_tokens()
    return tokens


def accept(matcher: Any, token: int) -> bool:
    """The token goes into the matcher; False when the grammar has no room for it."""
    if matcher.consume_token(token):
        return True
    log.warning("grammar refused token %d: %s", token, matcher.get_error())
    return False
