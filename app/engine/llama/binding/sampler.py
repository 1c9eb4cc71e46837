"""The llama.cpp side of sampling: a sampler chain per sequence, stop strings matched across
token boundaries, and the top log-probabilities of a row of logits (llama.cpp's
common_sampler). The OpenAI parameters are parsed in oai/sampling.py.
"""

from __future__ import annotations

import math
from typing import Any

from app.engine.llama.jobs.jobs import Sampling


def build_sampler(params: Sampling, n_vocab: int, seed: int, penalty_window: int) -> Any:
    """A sampler chain for one sequence: bias, penalties, then greedy or temp/top_p/dist (a
    grammar's mask is already on the logits it reads: grammars.py)."""
    import llama_cpp as lc

    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if params.logit_bias:
        # OpenAI's +-100 means "always" / "never"; a large finite bias does that reliably.
        biases = [lc.llama_logit_bias(token, bias) for token, bias in params.logit_bias.items()]
        items = (lc.llama_logit_bias * len(biases))(*biases)
        lc.llama_sampler_chain_add(
            chain, lc.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), items)
        )
    if params.presence_penalty or params.frequency_penalty:
        lc.llama_sampler_chain_add(
            chain,
            lc.llama_sampler_init_penalties(
                penalty_window, 1.0, params.frequency_penalty, params.presence_penalty
            ),
        )
    if params.temperature == 0.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    else:
        # OpenAI applies the temperature first, then the nucleus cut on the scaled distribution.
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
        if params.top_p < 1.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    return chain


def free_sampler(chain: Any) -> None:
    import llama_cpp as lc

    if chain:
        lc.llama_sampler_free(chain)


class StopMatcher:
    """Finds stop strings across token boundaries and holds back text that may start one.

    `feed` takes newly decoded text and returns the text that is safe to emit now;
    `stopped` turns true once a stop string appears, and nothing from it on is emitted.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""
        self.stopped = False
        self._longest = max((len(s) for s in stops), default=0)

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = self._held_back(self.pending)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return out

    def flush(self) -> str:
        """At the end of generation a held-back prefix that never became a stop is real text."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _held_back(self, text: str) -> int:
        for size in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) for s in self.stops):
                return size
        return 0


def top_logprobs_of(logits: Any, n_vocab: int, k: int) -> tuple[Any, list[int]]:
    """Log-softmax of one row of logits and the ids of its k most likely tokens."""
    import numpy as np

    row = np.ctypeslib.as_array(logits, shape=(n_vocab,)).astype(np.float64)
    row = row - row.max()
    logp = row - math.log(float(np.exp(row).sum()))
    top = [] if k <= 0 else [int(t) for t in np.argsort(-logp)[:k]]
    return logp, top
