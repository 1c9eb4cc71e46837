"""The embeddings path on the real default model: inputs packed longest first into few, full
decodes (app/engine/llama/contexts/embed.py's `pack`), with the vectors of one input at a time, in the
order given. The packing alone is tests/unit/engine/llama/contexts/test_embed.py."""

from __future__ import annotations

import random
from typing import Any

import llama_cpp as lc
import numpy as np
import pytest

from app.config import Settings
from app.engine.llama.contexts import embed
from app.engine.llama.loading import load_engine
from app.wire.endpoints import EMBEDDINGS


@pytest.fixture(scope="module")
def engine() -> Any:
    eng = load_engine(Settings(parallel=2, ctx_size=512))
    yield eng
    eng.close()


def token_inputs() -> list[list[int]]:
    """Distinct token inputs whose lengths, in this order, leave room in every decode:
    300 + 150 and 260 + 200 fill 450 and 460 of 512; longest first, 300 + 200 and
    260 + 150 + 100 fill 500 and 510."""
    rng = random.Random(7)
    return [[rng.randrange(100, 40_000) for _ in range(n)] for n in [300, 150, 260, 200, 100] * 2]


def test_inputs_share_full_decodes_and_keep_their_vectors_and_order(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = token_inputs()
    alone = [
        engine.submit(EMBEDDINGS, {"input": t}).result(timeout=120)["data"][0]["embedding"]
        for t in inputs
    ]
    decodes: list[int] = []
    real = lc.llama_decode

    def counted(ctx: Any, batch: Any) -> int:
        decodes.append(batch.n_tokens)
        return int(real(ctx, batch))

    monkeypatch.setattr(lc, "llama_decode", counted)
    body = engine.submit(EMBEDDINGS, {"input": inputs}).result(timeout=120)
    monkeypatch.undo()
    assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
    together, apart = np.array([d["embedding"] for d in body["data"]]), np.array(alone)
    # Each vector is its own input's, in its place: nearest to that input's vector alone.
    assert ((together @ apart.T).argmax(axis=1) == np.arange(len(inputs))).all()
    # The same vector up to what llama.cpp's kernels change with a decode's other rows
    # (alone or packed in order as before, up to ~7e-3 a component; cosine above 0.9998).
    assert (together * apart).sum(axis=1).min() > 0.999
    total = body["usage"]["prompt_tokens"]
    assert sum(decodes) == total
    # 2,020 tokens in 4 decodes (in order they took 5), none over the batch.
    assert total == 2020 and decodes == [500] * 2 + [510] * 2 and embed.EMBED_BATCH == 512
