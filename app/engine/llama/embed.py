"""Embeddings: a second llama.cpp context over the same weights, with pooling, and its decode.

The generation context keeps per-sequence KV streams and no pooling; embeddings need pooled
output and no cache between requests, so they get their own context, made on first use.
Inputs of many requests share each decode, each its own sequence, up to EMBED_BATCH tokens
(the engine's scheduler hands over as many queued requests as fill one; slots.py).
"""

from __future__ import annotations

from typing import Any

import llama_cpp as lc
import numpy as np

from app.engine.base import EngineError
from app.engine.llama.native import batch_add

#: Inputs embedded per llama_decode at most (each its own sequence).
EMBED_SEQS = 128
#: Tokens per llama_decode of the embeddings context (its n_batch = n_ubatch: a pooled input
#: must fit one micro-batch). Measured on 2 cores with ~43-token inputs (bench/README.md).
EMBED_BATCH = 512


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
        """One normalised float32 vector per prompt, as many prompts per decode as fit."""
        ctx = self._context()
        mem = lc.llama_get_memory(ctx)
        batch = lc.llama_batch_init(self.batch_tokens, 0, 1)
        vectors: list[np.ndarray] = []
        try:
            pending = list(prompts)
            while pending:
                group: list[list[int]] = []
                used = 0
                while (
                    pending
                    and len(group) < EMBED_SEQS
                    and used + len(pending[0]) <= self.batch_tokens
                ):
                    used += len(pending[0])
                    group.append(pending.pop(0))
                n = 0
                for seq, tokens in enumerate(group):
                    for pos, token in enumerate(tokens):
                        n = batch_add(batch, n, token, pos, seq, True)
                batch.n_tokens = n
                lc.llama_memory_clear(mem, True)
                if lc.llama_decode(ctx, batch) != 0:
                    raise EngineError(
                        "llama_decode failed on the embeddings context.",
                        status_code=500,
                        code="decode_failed",
                        type="server_error",
                    )
                for seq in range(len(group)):
                    vec = np.ctypeslib.as_array(
                        lc.llama_get_embeddings_seq(ctx, seq), shape=(self.dim,)
                    ).astype(np.float32)
                    norm = float(np.linalg.norm(vec))
                    vectors.append(vec / norm if norm > 0 else vec)
        finally:
            lc.llama_memory_clear(mem, True)
            lc.llama_batch_free(batch)
        return vectors

    def close(self) -> None:
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
