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
