"""PartialWrite: the temporary file appears with the first write, in the writer's thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.files.storage import Storage


def test_the_file_is_made_by_the_first_write_not_by_begin_write(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    partial = storage.begin_write(100)
    assert list(storage.tmp_dir.iterdir()) == []  # begun on the event loop: no file yet
    partial.write(b"hello\n")
    assert [p.name for p in storage.tmp_dir.iterdir()] == [partial.tmp_path.name]
    final = partial.commit("file-abc")
    assert final.read_bytes() == b"hello\n"
    assert list(storage.tmp_dir.iterdir()) == []
    partial.sync()  # a second sync (commit already synced) does nothing
    with pytest.raises(ValueError, match="already synced"):
        partial.write(b"more")


def test_an_empty_upload_is_still_a_file(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    final = storage.begin_write(100).commit("file-empty")
    assert final.exists() and final.read_bytes() == b""


def test_a_discarded_write_leaves_nothing_whether_or_not_it_began(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    never = storage.begin_write(100)
    never.discard()
    begun = storage.begin_write(100)
    begun.write(b"x")
    begun.discard()
    assert list(storage.tmp_dir.iterdir()) == []
    with pytest.raises(ValueError):
        begun.write(b"y")


def test_read_spans_gives_each_line_in_the_order_asked_in_few_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.files import storage as storage_module

    storage = Storage(tmp_path)
    lines = [f'{{"custom_id": "l{i}"}}\n'.encode() * (1 + i % 3) for i in range(50)]
    partial = storage.begin_write(10**6)
    for line in lines:
        partial.write(line)
    partial.commit("file-lines")
    offsets = [sum(len(x) for x in lines[:i]) for i in range(50)]
    spans = [(offsets[i], len(lines[i])) for i in (7, 3, 4, 40, 5, 0)]
    assert storage.read_spans("file-lines", spans) == [lines[i] for i in (7, 3, 4, 40, 5, 0)]
    assert storage.read_spans("file-lines", []) == []
    # Neighbours share one block; a span far away (past the gap) starts another.
    monkeypatch.setattr(storage_module, "SPAN_GAP_BYTES", 100)
    blocks = storage_module.span_blocks([(offsets[i], len(lines[i])) for i in (0, 1, 2, 45)])
    assert [members for _, _, members in blocks] == [[0, 1, 2], [3]]
    assert storage.read_spans("file-lines", spans) == [lines[i] for i in (7, 3, 4, 40, 5, 0)]
