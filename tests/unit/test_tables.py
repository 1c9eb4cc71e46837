"""OpenAI-style ids (app/tables.py): a prefix and 24 characters of the url-safe alphabet,
drawn together for a batch's lines."""

from __future__ import annotations

import re
from collections import Counter

from app.tables import ID_ALPHABET, new_id, new_ids


def test_ids_are_the_prefix_and_24_alphabet_characters_all_distinct() -> None:
    ids = new_ids("batch_req_", 20_000)
    assert len(ids) == 20_000 and len(set(ids)) == 20_000
    pattern = re.compile(r"batch_req_[a-zA-Z0-9]{24}")
    assert all(pattern.fullmatch(i) for i in ids)
    assert re.fullmatch(r"file-[a-zA-Z0-9]{24}", new_id("file-"))
    assert new_ids("x", 0) == []


def test_every_character_is_drawn_about_equally() -> None:
    """20,000 ids are 480,000 characters: about 7,742 of each of the 62; a mapping that
    favoured some (bytes % 62 without dropping 248-255) would give those 4/3 as many."""
    counts = Counter(c for i in new_ids("", 20_000) for c in i)
    assert set(counts) == set(ID_ALPHABET)
    expected = 20_000 * 24 / 62
    assert all(0.9 * expected < n < 1.1 * expected for n in counts.values()), counts
