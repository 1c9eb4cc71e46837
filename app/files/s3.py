"""File bytes in S3-compatible object storage (AWS S3, MinIO, R2, Ceph, SeaweedFS).

The same contract as the directory backend (app/files/storage.py), so nodes that share
no filesystem share one bucket: a write streams to a multipart upload in parts of
PART_BYTES (never the whole file in memory) and becomes visible under its id only when
committed; reads are ranged GETs, one per block of neighbouring lines; a delete removes
the object. Objects live under `<prefix>files/<file id>`: a write in progress is an
unfinished multipart upload to its id's key, invisible until completed and aborted on
discard; each part fills a spool file in the data dir's tmp/ before it is sent.

This module is the storage: reads (with their read-ahead), deletes, listings and the
sweeps of what a killed node left. The bucket, its client and its errors are in
bucket.py; the writes in bucket_writes.py. The client is `minio` (docs/object-storage.md says
why).
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from minio import Minio
from minio.error import S3Error

from app.files.bucket import MISSING, Bucket, Location, ObjectStream, store_errors
from app.files.bucket_writes import JoinedWrite, ObjectWrite
from app.files.storage import PartialWrite, Storage, span_blocks

#: A block of input lines read from the bucket reaches this far past its start, and is
#: kept: the runner claims a batch's lines in order, a few each step as results free room,
#: and the next claims are then read from memory instead of a ranged GET each (a GET takes
#: milliseconds on a store nearby, tens of them on AWS, and the runner waits for it).
READ_AHEAD_BYTES = 1024 * 1024
#: Blocks kept at once, the most recently read: one per input file being read.
KEPT_BLOCKS = 8
#: UploadPartCopy's smallest source, but for the last one (S3's smallest part).
MIN_JOINED_PART = 5 * 1024 * 1024


class S3Storage(Storage):
    """Storage whose file bytes are objects in a bucket. The data dir still holds what is
    this node's own: temporary files and the parts of Uploads API uploads."""

    def __init__(self, root: Path, client: Minio, location: Location) -> None:
        super().__init__(root)
        self.bucket = Bucket(client, location)
        self.client = client
        self.location = location
        # The last block read of each input file being read (see _block), most recent last.
        self._blocks: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._blocks_lock = threading.Lock()

    def key(self, file_id: str) -> str:
        return self.bucket.key(file_id)

    def describe(self) -> str:
        return self.bucket.describe()

    def begin_write(self, limit: int) -> PartialWrite:
        return ObjectWrite(self, self.bucket, limit)

    def begin_part_write(self, limit: int, upload_id: str) -> PartialWrite:
        return ObjectWrite(self, self.bucket, limit, upload_id)

    def begin_join(
        self, upload_id: str, parts: Sequence[tuple[str, int]], limit: int
    ) -> PartialWrite | None:
        """UploadPartCopy wants every part but the last to be at least 5 MiB (S3's
        smallest part); an upload of smaller parts is streamed, as on the directory."""
        sizes = [size for _, size in parts]
        if not parts or min(sizes[:-1], default=MIN_JOINED_PART) < MIN_JOINED_PART:
            return None
        keys = [self.part_key(upload_id, part_id) for part_id, _ in parts]
        return JoinedWrite(self, self.bucket, limit, keys, sum(sizes))

    def part_key(self, upload_id: str, part_id: str) -> str:
        return self.bucket.part_key(upload_id, part_id)

    def open_part(self, upload_id: str, part_id: str) -> io.BufferedReader:
        key = self.part_key(upload_id, part_id)
        return io.BufferedReader(ObjectStream(self.bucket.get(key)), buffer_size=1024 * 1024)

    def upload_folders(self) -> list[str]:
        prefix = self.bucket.uploads_prefix()
        listed = self.client.list_objects(self.location.bucket, prefix=prefix)
        return [(o.object_name or "")[len(prefix) :].strip("/") for o in listed if o.is_dir]

    def delete_parts(self, upload_id: str) -> None:
        super().delete_parts(upload_id)  # the empty local folder add_part makes
        prefix = self.bucket.uploads_prefix(upload_id)
        bucket = self.location.bucket
        for obj in self.client.list_objects(bucket, prefix=prefix, recursive=True):
            if obj.object_name and not obj.is_dir:
                self.client.remove_object(bucket, obj.object_name)

    def local_path(self, file_id: str) -> Path | None:  # noqa: ARG002 - Storage's signature
        return None

    def exists(self, file_id: str) -> bool:
        try:
            self.client.stat_object(self.location.bucket, self.key(file_id))
        except S3Error as exc:
            if exc.code in MISSING:
                return False
            raise
        return True

    def _get(self, file_id: str, offset: int = 0, length: int = 0) -> Any:
        """The file's object (see Bucket.get)."""
        return self.bucket.get(self.key(file_id), offset, length)

    def open_file(self, file_id: str) -> io.BufferedReader:
        return io.BufferedReader(ObjectStream(self._get(file_id)), buffer_size=1024 * 1024)

    def read_range(self, file_id: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        response = self._get(file_id, offset, length)
        try:
            with store_errors("read a file"):
                return bytes(response.read())
        finally:
            response.close()
            response.release_conn()

    def read_spans(self, file_id: str, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """One ranged GET per block of neighbouring spans (see Storage.read_spans), reading
        ahead: see READ_AHEAD_BYTES."""
        out: list[bytes] = [b""] * len(spans)
        for start, end, members in span_blocks(spans):
            at, block = self._block(file_id, start, end)
            for i in members:
                offset, length = spans[i]
                out[i] = block[offset - at : offset - at + length]
        return out

    def _block(self, file_id: str, start: int, end: int) -> tuple[int, bytes]:
        """(where it starts, bytes) of a block of the file holding [start, end): the one
        kept from an earlier read when it does, else READ_AHEAD_BYTES read from `start`
        (a larger block is read as it is and not kept)."""
        with self._blocks_lock:
            kept = self._blocks.get(file_id)
            if kept is not None and kept[0] <= start and end <= kept[0] + len(kept[1]):
                self._blocks.move_to_end(file_id)
                return kept
        if end - start > READ_AHEAD_BYTES:
            return start, self.read_range(file_id, start, end - start)
        block = self.read_range(file_id, start, READ_AHEAD_BYTES)  # less at the file's end
        with self._blocks_lock:
            self._blocks[file_id] = (start, block)
            self._blocks.move_to_end(file_id)
            while len(self._blocks) > KEPT_BLOCKS:
                self._blocks.popitem(last=False)
        return start, block

    def delete(self, file_id: str) -> None:
        with self._blocks_lock:
            self._blocks.pop(file_id, None)
        self.client.remove_object(self.location.bucket, self.key(file_id))

    def sweep_tmp(self, min_age: float = 0.0) -> int:
        """Remove this node's leftover spool files, and abort the multipart uploads under
        the prefix begun more than `min_age` seconds ago: a node killed mid-write (an
        upload, an output file at finalize) leaves one unfinished, invisible as a file but
        its parts stored (and billed) until aborted. Returns how many things went."""
        return super().sweep_tmp(min_age) + self.sweep_unfinished(min_age)

    def sweep_unfinished(self, min_age: float) -> int:
        """Abort the multipart uploads under the prefix begun more than `min_age` seconds
        ago (see sweep_tmp); returns how many."""
        count = 0
        bucket, now = self.location.bucket, time.time()
        key_marker = upload_marker = None
        while True:
            with store_errors("list the unfinished uploads"):
                found = self.client._list_multipart_uploads(
                    bucket,
                    prefix=self.location.prefix,
                    key_marker=key_marker,
                    upload_id_marker=upload_marker,
                )
            for upload in found.uploads:
                begun = upload.initiated_time.timestamp() if upload.initiated_time else now
                if upload.object_name and upload.upload_id and now - begun >= min_age:
                    with contextlib.suppress(S3Error):  # another node's sweep came first
                        self.client._abort_multipart_upload(
                            bucket, upload.object_name, upload.upload_id
                        )
                        count += 1
            if not found.is_truncated or not found.uploads:
                return count
            key_marker, upload_marker = found.uploads[-1].object_name, found.uploads[-1].upload_id

    def stored_files(self) -> Iterator[tuple[str, float]]:
        """(file id, age in seconds) of every object under the files prefix."""
        prefix = f"{self.location.prefix}files/"
        for obj in self.client.list_objects(self.location.bucket, prefix=prefix, recursive=True):
            if obj.is_dir:
                continue  # a store that keeps folders (SeaweedFS) lists the emptied ones
            name = (obj.object_name or "")[len(prefix) :]
            modified = obj.last_modified.timestamp() if obj.last_modified else time.time()
            yield name, time.time() - modified


__all__ = ["S3Storage"]
