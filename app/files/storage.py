"""File bytes on disk: streamed writes with a size cap, range and block reads, deletes.

Files are named by id under data_dir/files/, never by the name they were uploaded with.
A write goes to a temporary name first and is renamed into place only when complete,
so a crash or a refused upload never leaves a half-written file under an id.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


def data_dir_problem(root: Path) -> str | None:
    """Why the data dir cannot hold batchyard's state, or None when it can.

    Checked before the server starts, so a bad --data-dir is one clear line, not a
    traceback from deep inside startup: it must exist (or be creatable) and take a write.
    """
    probe = root / f".write-test-{secrets.token_hex(4)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as exc:
        return (
            f"The data dir {root} is not usable: {exc.strerror or exc}. Choose a writable "
            "directory with --data-dir or BATCHYARD_DATA_DIR."
        )
    return None


def checked_id(file_id: str) -> str:
    """`file_id` when it can name a file (letters, digits, `-`, `_`), else ValueError: an id
    from a request never reaches a path or an object key unchecked."""
    if not file_id.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"not a file id: {file_id!r}")
    return file_id


@dataclass
class Written:
    """A file whose bytes are committed under an id: what its File row records."""

    file_id: str
    size: int
    sha256: str


class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"File is larger than the limit of {limit} bytes")
        self.limit = limit


class PartialWrite:
    """A file being written: append chunks, then `commit(file_id)` or `discard()`.

    The temporary file is created by the first write (or by `sync` for an empty one), not
    here: an upload begins one on the event loop, where opening a file on a shared files
    location (NFS) would hold up every other request; writes run in a worker thread."""

    def __init__(self, storage: Storage, limit: int) -> None:
        self.storage = storage
        self.limit = limit
        self.size = 0
        self._sha = hashlib.sha256()
        self.tmp_path = storage.tmp_dir / f"upload-{secrets.token_hex(8)}"
        self._fh: BinaryIO | None = None
        self._closed = False  # synced or discarded: no more writes
        # The id this write is best committed under, when the backend wants to know it
        # first (a bucket streams the parts to that id's key); None lets the caller choose.
        self.file_id: str | None = None
        # The same for an Uploads API part (Storage.begin_part_write).
        self.part_id: str | None = None

    def _file(self) -> BinaryIO:
        if self._closed:
            raise ValueError("the partial write was already synced or discarded")
        if self._fh is None:
            self._fh = open(self.tmp_path, "wb")  # noqa: SIM115
        return self._fh

    def _count(self, chunk: bytes) -> None:
        """Add `chunk` to the size and the digest; past the limit, refuse it."""
        self.size += len(chunk)
        if self.size > self.limit:
            raise TooLarge(self.limit)
        self._sha.update(chunk)

    def write(self, chunk: bytes) -> None:
        self._count(chunk)
        self._file().write(chunk)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    def commit(self, file_id: str) -> Path:
        return self.commit_to(self.storage.path(file_id))

    def sync(self) -> None:
        """Put the written bytes on disk (the slow part of a commit), so that a caller can
        do it before it takes a lock; `commit_to` then only renames."""
        if self._closed:
            return
        fh = self._file()
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        self._fh, self._closed = None, True

    def commit_to(self, final: Path) -> Path:
        """Move the written bytes to `final` (a file id's path, or an upload part's)."""
        self.sync()
        os.replace(self.tmp_path, final)
        return final

    def discard(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._closed = True
        self.tmp_path.unlink(missing_ok=True)


class Storage:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.files_dir = root / "files"
        self.tmp_dir = root / "tmp"
        # The parts of unfinished uploads (POST /v1/uploads), one folder per upload.
        self.uploads_dir = root / "uploads"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.uploads_dir.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        return self.files_dir / checked_id(file_id)

    def part_path(self, upload_id: str, part_id: str) -> Path:
        """Where an upload part's bytes live. The upload's folder is made by the part that
        is kept first (UploadService.add_part), not here: a refused part leaves none."""
        return self.uploads_dir / self.path(upload_id).name / self.path(part_id).name

    def open_part(self, upload_id: str, part_id: str) -> BinaryIO:
        """An upload part's bytes as a stream from the start (the caller closes it)."""
        return open(self.part_path(upload_id, part_id), "rb")

    def upload_folders(self) -> list[str]:
        """The ids of the uploads that have parts stored (for the leftover sweep)."""
        return [p.name for p in self.uploads_dir.iterdir() if p.is_dir()]

    def delete_parts(self, upload_id: str) -> None:
        shutil.rmtree(self.uploads_dir / self.path(upload_id).name, ignore_errors=True)

    def describe(self) -> str:
        """Where file bytes live, for logs and messages."""
        return str(self.files_dir)

    def begin_write(self, limit: int) -> PartialWrite:
        return PartialWrite(self, limit)

    def begin_join(
        self,
        upload_id: str,  # noqa: ARG002 - the stores' interface: a bucket joins, a directory cannot
        parts: Sequence[tuple[str, int]],  # noqa: ARG002
        limit: int,  # noqa: ARG002
    ) -> PartialWrite | None:
        """A write that joins an upload's parts ((part id, bytes), in order) inside the store
        itself, or None where the store cannot (the caller then writes their bytes to a
        `begin_write`). The caller still writes every byte of the parts to it, in order:
        they are hashed and counted, not stored; `commit` has the store join the parts."""
        return None

    def begin_part_write(self, limit: int, upload_id: str) -> PartialWrite:  # noqa: ARG002 - the stores' interface
        """A write of one part of upload `upload_id` (kept under the upload's folder by
        `commit_to`)."""
        return PartialWrite(self, limit)

    def local_path(self, file_id: str) -> Path | None:
        """The file's path when its bytes are a local file (None on object storage)."""
        return self.path(file_id)

    def exists(self, file_id: str) -> bool:
        return self.path(file_id).is_file()

    def open_file(self, file_id: str) -> BinaryIO:
        """The file's bytes as a stream read from the start (the caller closes it)."""
        return open(self.path(file_id), "rb")

    def read_range(self, file_id: str, offset: int, length: int) -> bytes:
        with open(self.path(file_id), "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    def read_spans(self, file_id: str, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each (offset, length) span of one file, in the order given.

        Neighbouring spans (a batch's lines claimed together) are read as one block, one
        read for many lines instead of an open and a read each; a gap wider than
        SPAN_GAP_BYTES or a block past SPAN_BLOCK_BYTES starts a new read. A backend on
        object storage implements the same contract with one ranged GET per block."""
        out: list[bytes] = [b""] * len(spans)
        if not spans:
            return out
        with open(self.path(file_id), "rb") as fh:
            for start, end, members in span_blocks(spans):
                fh.seek(start)
                block = fh.read(end - start)
                for i in members:
                    offset, length = spans[i]
                    out[i] = block[offset - start : offset - start + length]
        return out

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    def stored_files(self) -> Iterator[tuple[str, float]]:
        """(file id, age in seconds) of every stored file, for the orphan sweep."""
        now = time.time()
        for path in self.files_dir.iterdir():
            try:
                yield path.name, now - path.stat().st_mtime
            except FileNotFoundError:
                continue

    def sweep_unfinished(self, min_age: float) -> int:  # noqa: ARG002 - the stores' interface
        """Remove writes left unfinished in a store shared by the nodes, begun more than
        `min_age` seconds ago; the runner calls it on its sweeps. A directory has none
        (its temporary files are each node's own, removed by `sweep_tmp` at start)."""
        return 0

    def sweep_tmp(self, min_age: float = 0.0) -> int:
        """Remove temporary files left by a crash (those older than `min_age` seconds:
        on a shared files location, younger ones may be another node's uploads)."""
        count = 0
        for leftover in self.tmp_dir.iterdir():
            if older_than(leftover, min_age):
                leftover.unlink(missing_ok=True)
                count += 1
        return count


#: Writes left unfinished in a shared store are removed by the runner's sweeps once they
#: are this old (a day, as S3 lifecycle rules commonly abort them): no upload or output
#: file takes that long, and a start removes those of a dead node an hour old already.
UNFINISHED_MAX_AGE = 24 * 3600.0
#: Spans further apart than this are read separately (the bytes between them are skipped).
SPAN_GAP_BYTES = 64 * 1024
#: One block read holds at most this much (a claim of long lines reads in several).
SPAN_BLOCK_BYTES = 8 * 1024 * 1024


def span_blocks(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int, list[int]]]:
    """Group (offset, length) spans into blocks to read: (start, end, indexes of spans)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    blocks: list[tuple[int, int, list[int]]] = []
    start = end = 0
    members: list[int] = []
    for i in order:
        offset, length = spans[i]
        if (
            members
            and offset - end <= SPAN_GAP_BYTES
            and offset + length - start <= SPAN_BLOCK_BYTES
        ):
            end = max(end, offset + length)
            members.append(i)
            continue
        if members:
            blocks.append((start, end, members))
        start, end, members = offset, offset + length, [i]
    if members:
        blocks.append((start, end, members))
    return blocks


def older_than(path: Path, seconds: float) -> bool:
    """Whether `path` was last changed more than `seconds` ago (True when it is gone)."""
    if seconds <= 0:
        return True
    try:
        return time.time() - path.stat().st_mtime > seconds
    except FileNotFoundError:
        return True
