"""embed.py's `pack`: which inputs share which embeddings decode (the decodes themselves,
on the real model, are tests/integration/test_embed_packing.py)."""

from __future__ import annotations

from app.engine.llama.contexts.embed import pack


def test_pack_fills_each_decode_longest_first() -> None:
    # In order, 300 + 150 would leave the 250 and 200 a decode each (three); longest first,
    # 300 + 200 and 250 + 150 + 100 fill two.
    lengths = [300, 150, 250, 200, 100]
    assert pack(lengths, 500, 8) == [[0, 3], [2, 1, 4]]


def test_pack_keeps_to_the_sequences_of_a_decode_and_places_every_input_once() -> None:
    lengths = [10] * 7
    decodes = pack(lengths, 500, 3)
    assert [len(d) for d in decodes] == [3, 3, 1]
    assert sorted(i for d in decodes for i in d) == list(range(7))
    assert pack([], 500, 3) == []
