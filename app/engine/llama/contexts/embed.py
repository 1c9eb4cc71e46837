"""Embeddings: a second llama.cpp context over the same weights, with pooling, and its decode.

The generation context keeps per-sequence KV streams and no pooling; embeddings need pooled
output and no cache between requests, so they get their own context, made on first use.
Inputs of many requests share each decode, each its own sequence, up to EMBED_BATCH tokens
(the engine's scheduler hands over as many queued requests as fill one, the longest that fit
after the head; slots.py), packed longest first (`pack`) into a llama_batch filled by numpy
(`_Rows`): no Python loop over tokens between decodes.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import llama_cpp as lc
import numpy as np

from app.engine.base import EngineError

#: Inputs embedded per llama_decode at most (each its own sequence).
EMBED_SEQS = 128
#: Tokens per llama_decode of the embeddings context (its n_batch = n_ubatch: a pooled input
#: must fit one micro-batch). Measured on 2 cores with ~43-token inputs (bench/README.md).
EMBED_BATCH = 512


def pack(lengths: list[int], max_tokens: int, max_seqs: int) -> list[list[int]]:
    """The decodes for inputs of these lengths: lists of their indices, each at most
    `max_tokens` tokens and `max_seqs` inputs. Longest first, each into the first decode with
    room (first-fit decreasing), so the decodes are full and fewest; an input longer than
    `max_tokens` is never given (the context is made for the longest)."""
    decodes: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for d, left in enumerate(room):
            if lengths[i] <= left and len(decodes[d]) < max_seqs:
                decodes[d].append(i)
                room[d] -= lengths[i]
                break
        else:
            decodes.append([i])
            room.append(max_tokens - lengths[i])
    return decodes


class _Rows:
    """A llama_batch over numpy arrays, filled a decode at a time without a loop over
    tokens: each row one output token of sequence `seq` at position `pos`."""

    def __init__(self, capacity: int) -> None:
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.logits = np.ones(capacity, np.int8)  # pooled embeddings need every row
        self._seq_ids = np.arange(EMBED_SEQS, dtype=np.int32)  # what seq_id's rows point to
        self.seq_id = np.zeros(capacity, np.uintp)
        batch = lc.llama_batch()
        batch.token = _pointer(self.token, ctypes.c_int32)
        batch.pos = _pointer(self.pos, ctypes.c_int32)
        batch.n_seq_id = _pointer(self.n_seq_id, ctypes.c_int32)
        batch.seq_id = _pointer(self.seq_id, ctypes.POINTER(ctypes.c_int32))
        batch.logits = _pointer(self.logits, ctypes.c_int8)
        self.batch = batch

    def fill(self, inputs: list[list[int]]) -> None:
        """Input k as sequence k, positions from 0."""
        lengths = np.fromiter((len(t) for t in inputs), np.int64, len(inputs))
        n = int(lengths.sum())
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        self.token[:n] = np.fromiter(itertools.chain.from_iterable(inputs), np.int32, n)
        self.pos[:n] = np.arange(n) - starts
        seqs = np.repeat(np.arange(len(inputs)), lengths)
        self.seq_id[:n] = self._seq_ids.ctypes.data + seqs * self._seq_ids.itemsize
        self.batch.n_tokens = n


def _pointer(array: np.ndarray, ctype: Any) -> Any:
    return ctypes.cast(array.ctypes.data, ctypes.POINTER(ctype))


def _unavailable(message: str) -> EngineError:
    return EngineError(message, status_code=500, code="embeddings_unavailable", type="server_error")


class Embedder:
    """Unit-length vectors for token inputs, from the owner thread only."""

    def __init__(self, model: Any, *, ctx_size: int, threads: int, dim: int) -> None:
        self._model = model
        self.ctx_size = ctx_size  # the longest input
        self.batch_tokens = max(ctx_size, EMBED_BATCH)  # tokens per decode
        self.threads = threads
        self.dim = dim
        self._ctx: Any = None

    def _context(self) -> Any:
        if self._ctx:
            return self._ctx
        for pooling in (lc.LLAMA_POOLING_TYPE_UNSPECIFIED, lc.LLAMA_POOLING_TYPE_MEAN):
            params = lc.llama_context_default_params()
            params.embeddings = True
            params.pooling_type = pooling
            params.n_ctx = self.batch_tokens
            params.n_batch = params.n_ubatch = self.batch_tokens  # a pooled input fits one ubatch
            params.n_seq_max = EMBED_SEQS
            params.kv_unified = True  # inputs share one buffer; each decode starts empty
            params.n_threads = params.n_threads_batch = self.threads
            params.no_perf = True
            ctx = lc.llama_init_from_model(self._model, params)
            if not ctx:
                raise _unavailable("Could not create the embeddings context.")
            if lc.llama_pooling_type(ctx) != lc.LLAMA_POOLING_TYPE_NONE:
                self._ctx = ctx
                return ctx
            # The model defines no pooling (a generative model): mean-pool like OpenAI-style servers.
            lc.llama_free(ctx)
        raise _unavailable("This model cannot produce pooled embeddings.")

    def embed(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """One normalised float32 vector per prompt, in their order; the prompts packed
        longest first into as few decodes as hold them (`pack`)."""
        ctx = self._context()
        mem = lc.llama_get_memory(ctx)
        rows = _Rows(self.batch_tokens)
        vectors: list[np.ndarray] = [np.empty(0, np.float32)] * len(prompts)
        try:
            for group in pack([len(p) for p in prompts], self.batch_tokens, EMBED_SEQS):
                rows.fill([prompts[i] for i in group])
                lc.llama_memory_clear(mem, True)
                if lc.llama_decode(ctx, rows.batch) != 0:
                    raise EngineError(
                        "llama_decode failed on the embeddings context.",
                        status_code=500,
                        code="decode_failed",
                        type="server_error",
                    )
                pooled = np.stack(
                    [
                        np.ctypeslib.as_array(lc.llama_get_embeddings_seq(ctx, seq), (self.dim,))
                        for seq in range(len(group))
                    ]
                ).astype(np.float32)
                norms = np.linalg.norm(pooled, axis=1, keepdims=True)
                pooled /= np.where(norms > 0, norms, 1.0)
                for i, vec in zip(group, pooled, strict=True):
                    vectors[i] = vec
        finally:
            lc.llama_memory_clear(mem, True)
        return vectors

    def close(self) -> None:
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
