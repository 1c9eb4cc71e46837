"""Writes of file bytes to a bucket: streamed in parts, or joined by the store.

An `ObjectWrite` streams to a multipart upload in parts of PART_BYTES (never the whole file
in memory) under the key of the id it chose, so the bytes become visible under that id only
when committed; each part fills a spool file in the data dir's tmp/ before it is sent, and
a discard aborts the upload. A `JoinedWrite` is an Uploads API file whose parts the store
joins itself (UploadPartCopy). Both are the `PartialWrite` of app/files/storage.py, as the
directory backend's writes are; s3.py begins them.

The client is `minio`. Its multipart calls are used one part at a time, so the writer
pushes bytes as they arrive rather than handing the client a whole stream; the minio
version is pinned for that reason.
"""

from __future__ import annotations

import contextlib
import mmap
import secrets
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, cast

import urllib3
from minio import Minio
from minio.commonconfig import ComposeSource
from minio.datatypes import Part
from minio.error import MinioException

from app.files.bucket import Bucket, store_errors
from app.files.storage import PartialWrite, Storage
from app.tables import new_id

#: Bytes held before they go out as one part (S3 wants at least 5 MiB for all but the last).
PART_BYTES = 8 * 1024 * 1024
#: Sends the parts of every write in flight: its threads bound the parts held in memory
#: (4 x PART_BYTES) whatever the number of writes at once.
PART_SENDERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="s3-part")


class ObjectWrite(PartialWrite):
    """A file being written to the bucket: parts go out as PART_BYTES fill up.

    Each part fills a spool file of its own in the data dir's tmp/ and a PART_SENDERS
    thread reads it back, sends it and removes it. So what a write holds in memory is
    nothing but the chunk at hand, whatever the number of writes at once: the parts in
    memory are those being sent, at most PART_SENDERS' threads of them. (Parts filled in
    memory held about 24 MiB a write: 8 parts of an upload sent at once took the server
    from 390 to 600 MiB.)
    """

    def __init__(
        self, storage: Storage, bucket: Bucket, limit: int, upload_id: str | None = None
    ) -> None:
        super().__init__(storage, limit)
        self.bucket = bucket
        # Parts stream to the key of the id chosen here (a file's, or with `upload_id` an
        # Uploads API part's): a multipart upload is invisible until completed, so the
        # bytes appear whole under that id when committed, with no copy. A commit under
        # another key completes to this one and copies.
        if upload_id is None:
            self.file_id = new_id("file-")
            self.tmp_key = bucket.key(self.file_id)
        else:
            self.part_id = new_id("part_")
            self.tmp_key = bucket.part_key(upload_id, self.part_id)
        self._spool: BinaryIO | None = None  # the part being filled
        self._filled = 0  # its bytes so far
        self._spools: list[Path] = []  # every spool file made, removed by the end
        self._upload_id: str | None = None
        self._sends: list[Future[str]] = []  # one a part, in order: each gives its ETag
        self._committed = False

    def write(self, chunk: bytes) -> None:
        if self._closed:
            raise ValueError("the partial write was already synced or discarded")
        self._count(chunk)
        view = memoryview(chunk)
        while view:
            piece = view[: PART_BYTES - self._filled]
            self._spool_file().write(piece)
            self._filled += len(piece)
            view = view[len(piece) :]
            if self._filled == PART_BYTES:
                with store_errors("store a part of a file"):
                    self._send()

    def _spool_file(self) -> BinaryIO:
        if self._spool is None:
            path = self.storage.tmp_dir / f"part-{secrets.token_hex(8)}"
            self._spools.append(path)
            self._spool = open(path, "wb")  # noqa: SIM115 - closed by _send or discard
        return self._spool

    def _close_spool(self) -> Path:
        self._spool_file().close()
        self._spool, self._filled = None, 0
        return self._spools[-1]

    def _send(self) -> None:
        """Hand the part filled so far to the senders. A write keeps at most two parts
        queued or in flight, so a store slower than the client holds the client back
        instead of filling the local disk."""
        path = self._close_spool()
        client, bucket = self.bucket.client, self.bucket.name
        if self._upload_id is None:
            self._upload_id = client._create_multipart_upload(bucket, self.tmp_key, {})
        if len(self._sends) >= 2:
            self._sends[-2].result()
        number = len(self._sends) + 1
        self._sends.append(
            PART_SENDERS.submit(
                send_part,
                client,
                bucket,
                self.tmp_key,
                upload_id=self._upload_id,
                number=number,
                spool=path,
            )
        )

    def sync(self) -> None:
        """Nothing to do: parts are sent as they fill, the rest goes out at commit."""

    def commit(self, file_id: str) -> Path:
        """Put the bytes under `file_id`'s key. A file under one part is one PUT; a larger
        one completes its multipart upload, in place when `file_id` is the one this write
        chose (self.file_id), else copied server-side to its key."""
        return self._commit_key(self.bucket.key(file_id))

    def commit_to(self, final: Path) -> Path:
        """Keep an Uploads API part: `final` is Storage.part_path's, whose last two names
        (upload id, part id) name the part's key in the bucket."""
        return self._commit_key(self.bucket.part_key(final.parent.name, final.name))

    def _commit_key(self, key: str) -> Path:
        if self._closed:
            raise ValueError("the partial write was already committed or discarded")
        with store_errors("store a file"):
            return self._complete(key)

    def _complete(self, key: str) -> Path:
        client, bucket = self.bucket.client, self.bucket.name
        try:
            if self._upload_id is None:
                path = self._close_spool()
                with open(path, "rb") as fh:
                    client.put_object(bucket, key, fh, self.size)
                path.unlink()
            else:
                if self._filled:
                    self._send()
                parts = [Part(n, sent.result()) for n, sent in enumerate(self._sends, 1)]
                client._complete_multipart_upload(bucket, self.tmp_key, self._upload_id, parts)
                self._upload_id = None
                if key != self.tmp_key:
                    self.bucket.copy(self.tmp_key, key, self.size)
                    client.remove_object(bucket, self.tmp_key)
        except BaseException:
            self.discard()
            raise
        self._closed = self._committed = True
        return Path(key)

    def discard(self) -> None:
        if self._committed:
            return  # the bytes are the file now: only a delete of its id removes them
        self._closed = True
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        client, bucket = self.bucket.client, self.bucket.name
        for sent in self._sends:
            if not sent.cancel():
                with contextlib.suppress(Exception):
                    sent.result()  # an abort while a part is sent may leave it behind
        self._sends = []
        for path in self._spools:
            path.unlink(missing_ok=True)
        # A store that refuses or does not answer now leaves what a start's sweep removes
        # (an unfinished upload; an object under no File row): a discard never raises.
        unreachable = (MinioException, urllib3.exceptions.HTTPError)
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            with contextlib.suppress(*unreachable):
                client._abort_multipart_upload(bucket, self.tmp_key, upload_id)
        with contextlib.suppress(*unreachable):
            client.remove_object(bucket, self.tmp_key)


class JoinedWrite(PartialWrite):
    """An Uploads API file joined from its parts by the store (UploadPartCopy, through
    minio's compose_object): the bytes written are hashed and counted for the checks and
    the File row, and only the commit touches the bucket, so an md5 that does not match
    leaves nothing behind. The parts are read once and never sent again."""

    def __init__(
        self, storage: Storage, bucket: Bucket, limit: int, sources: list[str], total: int
    ) -> None:
        super().__init__(storage, limit)
        self.bucket = bucket
        self.file_id = new_id("file-")
        self.sources = sources
        self.total = total

    def write(self, chunk: bytes) -> None:
        if self._closed:
            raise ValueError("the partial write was already committed or discarded")
        self._count(chunk)

    def sync(self) -> None:
        """Nothing to do: the store joins the parts at commit."""

    def commit(self, file_id: str) -> Path:
        if self._closed:
            raise ValueError("the partial write was already committed or discarded")
        if self.size != self.total:
            self.discard()
            raise ValueError(f"{self.size} bytes were hashed of the parts' {self.total}")
        bucket, key = self.bucket.name, self.bucket.key(file_id)
        sources = [ComposeSource(bucket, source) for source in self.sources]
        try:
            with store_errors("join an upload's parts"):
                self.bucket.client.compose_object(bucket, key, sources)
        finally:  # a failed join aborts its own multipart upload
            self._closed = True
        return Path(key)

    def commit_to(self, final: Path) -> Path:  # noqa: ARG002 - PartialWrite's signature
        raise ValueError("a joined file is committed under a file id, not as a part")

    def discard(self) -> None:
        self._closed = True  # nothing was written to the bucket before the commit


def send_part(
    client: Minio, bucket: str, key: str, *, upload_id: str, number: int, spool: Path
) -> str:
    """Send one part from its spool file and remove the file; returns the part's ETag.

    The part is read into a mapping of its own, unmapped when sent: 8 MiB bytes objects
    made and freed by four threads left the heap fragmented (the server kept about 20 MiB
    more after each round of parallel parts)."""
    try:
        size = spool.stat().st_size
        with mmap.mmap(-1, max(size, 1)) as memory:
            with open(spool, "rb") as fh:
                fh.readinto(memory)
            with memoryview(memory)[:size] as data:
                # The client only hashes the body and hands it to urllib3 (bytes-like).
                return client._upload_part(bucket, key, cast(bytes, data), None, upload_id, number)
    finally:
        spool.unlink(missing_ok=True)


__all__ = ["PART_BYTES", "PART_SENDERS", "JoinedWrite", "ObjectWrite", "send_part"]
