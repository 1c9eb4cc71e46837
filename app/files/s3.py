"""File bytes in S3-compatible object storage (AWS S3, MinIO, R2, Ceph, SeaweedFS).

The same contract as the directory backend (app/files/storage.py), so nodes that share
no filesystem share one bucket: a write streams to a multipart upload in parts of
PART_BYTES (never the whole file in memory) and becomes visible under its id only when
committed; reads are ranged GETs, one per block of neighbouring lines; a delete removes
the object. Objects live under `<prefix>files/<file id>`: a write in progress is an
unfinished multipart upload to its id's key, invisible until completed and aborted on
discard; each part fills a spool file in the data dir's tmp/ before it is sent.

The client is `minio` (see the README's "Object storage" section for why). Its multipart
calls are used one part at a time, so the writer pushes bytes as they arrive rather than
handing the client a whole stream; the minio version is pinned for that reason.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.commonconfig import ComposeSource, CopySource
from minio.credentials.providers import (
    AWSConfigProvider,
    ChainedProvider,
    EnvAWSProvider,
    IamAwsProvider,
)
from minio.datatypes import Part
from minio.error import MinioException, S3Error

from app.files.storage import PartialWrite, Storage, TooLarge, span_blocks
from app.tables import new_id

#: Bytes held before they go out as one part (S3 wants at least 5 MiB for all but the last).
PART_BYTES = 8 * 1024 * 1024
#: Sends the parts of every write in flight: its threads bound the parts held in memory
#: (4 x PART_BYTES) whatever the number of writes at once.
PART_SENDERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="s3-part")
#: The error codes of an object that is not there.
MISSING = ("NoSuchKey", "NoSuchObject", "ResourceNotFound")
#: A block of input lines read from the bucket reaches this far past its start, and is
#: kept: the runner claims a batch's lines in order, a few each step as results free room,
#: and the next claims are then read from memory instead of a ranged GET each (a GET takes
#: milliseconds on a store nearby, tens of them on AWS, and the runner waits for it).
READ_AHEAD_BYTES = 1024 * 1024
#: Blocks kept at once, the most recently read: one per input file being read.
KEPT_BLOCKS = 8
#: UploadPartCopy's smallest source, but for the last one (S3's smallest part).
MIN_JOINED_PART = 5 * 1024 * 1024
#: CopyObject's limit; a larger object is copied by UploadPartCopy (compose_object).
COPY_OBJECT_MAX = 5 * 1024 * 1024 * 1024


@dataclass(frozen=True)
class Location:
    """Where files live: a bucket and a key prefix ("" or ending in "/")."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Location:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://BUCKET/PREFIX url: {url!r}")
        prefix = parts.path.strip("/")
        return cls(parts.netloc, f"{prefix}/" if prefix else "")


def make_client(endpoint: str | None) -> Minio:
    """A client for `endpoint` (AWS when None) with credentials from the standard AWS chain:
    the environment, then the shared profile, then an instance or pod role."""
    target = urlsplit(endpoint) if endpoint else urlsplit("https://s3.amazonaws.com")
    if not target.hostname:
        raise ValueError(f"not an endpoint url: {endpoint!r}")
    host = target.hostname + (f":{target.port}" if target.port else "")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    chain = ChainedProvider([EnvAWSProvider(), AWSConfigProvider(), IamAwsProvider()])
    # Few quick retries: a store that is down should fail `serve`'s check in seconds, and
    # a pool as large as the runner's readers, so parallel ranged GETs do not queue.
    http = urllib3.PoolManager(
        maxsize=32,
        timeout=urllib3.Timeout(connect=5, read=120),
        retries=urllib3.Retry(total=3, backoff_factor=0.1, status_forcelist=[500, 502, 503, 504]),
    )
    return Minio(
        host,
        secure=target.scheme == "https",
        region=region,
        credentials=chain,
        http_client=http,
    )


class StoreError(OSError):
    """The object store refused a request or did not answer. An OSError, as a disk's
    failure is, so that what the callers do on a storage failure (an upload answered 500,
    finalize's retries and then a failed batch, an input line that cannot be read) is the
    same on both backends."""


@contextlib.contextmanager
def store_errors(doing: str) -> Iterator[None]:
    """Raise the store's failures while `doing` as StoreError (a missing object as
    FileNotFoundError), with a message a user can act on."""
    try:
        yield
    except S3Error as exc:
        if exc.code in MISSING:
            raise FileNotFoundError(errno.ENOENT, "No such object", exc.resource) from None
        message = f"the object store refused to {doing} ({exc.code}: {exc.message})"
        raise StoreError(errno.EIO, message) from exc
    except (MinioException, urllib3.exceptions.HTTPError) as exc:
        message = f"the object store did not answer while trying to {doing}: {exc}"
        raise StoreError(errno.EIO, message) from exc


class ObjectStream(io.RawIOBase):
    """An object's bytes read as they arrive (a file-like for validators and downloads)."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with store_errors("read a file"):
            data = self._response.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._response.close()
            self._response.release_conn()
        super().close()


class ObjectWrite(PartialWrite):
    """A file being written to the bucket: parts go out as PART_BYTES fill up.

    Each part fills a spool file of its own in the data dir's tmp/ and a PART_SENDERS
    thread reads it back, sends it and removes it. So what a write holds in memory is
    nothing but the chunk at hand, whatever the number of writes at once: the parts in
    memory are those being sent, at most PART_SENDERS' threads of them. (Parts filled in
    memory held about 24 MiB a write: 8 parts of an upload sent at once took the server
    from 390 to 600 MiB.)
    """

    def __init__(self, storage: S3Storage, limit: int, upload_id: str | None = None) -> None:
        super().__init__(storage, limit)
        self.s3 = storage
        # Parts stream to the key of the id chosen here (a file's, or with `upload_id` an
        # Uploads API part's): a multipart upload is invisible until completed, so the
        # bytes appear whole under that id when committed, with no copy. A commit under
        # another key completes to this one and copies.
        if upload_id is None:
            self.file_id = new_id("file-")
            self.tmp_key = storage.key(self.file_id)
        else:
            self.part_id = new_id("part_")
            self.tmp_key = storage.part_key(upload_id, self.part_id)
        self._spool: BinaryIO | None = None  # the part being filled
        self._filled = 0  # its bytes so far
        self._spools: list[Path] = []  # every spool file made, removed by the end
        self._upload_id: str | None = None
        self._sends: list[Future[str]] = []  # one a part, in order: each gives its ETag
        self._committed = False

    def write(self, chunk: bytes) -> None:
        if self._closed:
            raise ValueError("the partial write was already synced or discarded")
        self.size += len(chunk)
        if self.size > self.limit:
            raise TooLarge(self.limit)
        self._sha.update(chunk)
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
        client, bucket = self.s3.client, self.s3.location.bucket
        if self._upload_id is None:
            self._upload_id = client._create_multipart_upload(bucket, self.tmp_key, {})
        if len(self._sends) >= 2:
            self._sends[-2].result()
        number = len(self._sends) + 1
        self._sends.append(
            PART_SENDERS.submit(
                send_part, client, bucket, self.tmp_key, self._upload_id, number, path
            )
        )

    def sync(self) -> None:
        """Nothing to do: parts are sent as they fill, the rest goes out at commit."""

    def commit(self, file_id: str) -> Path:
        """Put the bytes under `file_id`'s key. A file under one part is one PUT; a larger
        one completes its multipart upload, in place when `file_id` is the one this write
        chose (self.file_id), else copied server-side to its key."""
        return self._commit_key(self.s3.key(file_id))

    def commit_to(self, final: Path) -> Path:
        """Keep an Uploads API part: `final` is Storage.part_path's, whose last two names
        (upload id, part id) name the part's key in the bucket."""
        return self._commit_key(self.s3.part_key(final.parent.name, final.name))

    def _commit_key(self, key: str) -> Path:
        if self._closed:
            raise ValueError("the partial write was already committed or discarded")
        with store_errors("store a file"):
            return self._complete(key)

    def _complete(self, key: str) -> Path:
        client, bucket = self.s3.client, self.s3.location.bucket
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
                    self.s3.copy(self.tmp_key, key, self.size)
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
        client, bucket = self.s3.client, self.s3.location.bucket
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

    def __init__(self, storage: S3Storage, limit: int, sources: list[str], total: int) -> None:
        super().__init__(storage, limit)
        self.s3 = storage
        self.file_id = new_id("file-")
        self.sources = sources
        self.total = total

    def write(self, chunk: bytes) -> None:
        if self._closed:
            raise ValueError("the partial write was already committed or discarded")
        self.size += len(chunk)
        if self.size > self.limit:
            raise TooLarge(self.limit)
        self._sha.update(chunk)

    def sync(self) -> None:
        """Nothing to do: the store joins the parts at commit."""

    def commit(self, file_id: str) -> Path:
        if self._closed:
            raise ValueError("the partial write was already committed or discarded")
        if self.size != self.total:
            self.discard()
            raise ValueError(f"{self.size} bytes were hashed of the parts' {self.total}")
        bucket, key = self.s3.location.bucket, self.s3.key(file_id)
        sources = [ComposeSource(bucket, source) for source in self.sources]
        try:
            with store_errors("join an upload's parts"):
                self.s3.client.compose_object(bucket, key, sources)
        finally:  # a failed join aborts its own multipart upload
            self._closed = True
        return Path(key)

    def commit_to(self, final: Path) -> Path:
        raise ValueError("a joined file is committed under a file id, not as a part")

    def discard(self) -> None:
        self._closed = True  # nothing was written to the bucket before the commit


def send_part(
    client: Minio, bucket: str, key: str, upload_id: str, number: int, spool: Path
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


class S3Storage(Storage):
    """Storage whose file bytes are objects in a bucket. The data dir still holds what is
    this node's own: temporary files and the parts of Uploads API uploads."""

    def __init__(self, root: Path, client: Minio, location: Location) -> None:
        super().__init__(root)
        self.client = client
        self.location = location
        # The last block read of each input file being read (see _block), most recent last.
        self._blocks: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._blocks_lock = threading.Lock()

    def key(self, file_id: str) -> str:
        return f"{self.location.prefix}files/{self.path(file_id).name}"

    def describe(self) -> str:
        return f"s3://{self.location.bucket}/{self.location.prefix}"

    def begin_write(self, limit: int) -> PartialWrite:
        return ObjectWrite(self, limit)

    def begin_part_write(self, limit: int, upload_id: str) -> PartialWrite:
        return ObjectWrite(self, limit, upload_id)

    def begin_join(
        self, upload_id: str, parts: Sequence[tuple[str, int]], limit: int
    ) -> PartialWrite | None:
        """UploadPartCopy wants every part but the last to be at least 5 MiB (S3's
        smallest part); an upload of smaller parts is streamed, as on the directory."""
        sizes = [size for _, size in parts]
        if not parts or min(sizes[:-1], default=MIN_JOINED_PART) < MIN_JOINED_PART:
            return None
        keys = [self.part_key(upload_id, part_id) for part_id, _ in parts]
        return JoinedWrite(self, limit, keys, sum(sizes))

    def part_key(self, upload_id: str, part_id: str) -> str:
        upload, part = self.path(upload_id).name, self.path(part_id).name
        return f"{self.location.prefix}uploads/{upload}/{part}"

    def open_part(self, upload_id: str, part_id: str) -> io.BufferedReader:
        key = self.part_key(upload_id, part_id)
        return io.BufferedReader(ObjectStream(self._get_key(key)), buffer_size=1024 * 1024)

    def upload_folders(self) -> list[str]:
        prefix = f"{self.location.prefix}uploads/"
        listed = self.client.list_objects(self.location.bucket, prefix=prefix)
        return [(o.object_name or "")[len(prefix) :].strip("/") for o in listed if o.is_dir]

    def delete_parts(self, upload_id: str) -> None:
        super().delete_parts(upload_id)  # the empty local folder add_part makes
        prefix = f"{self.location.prefix}uploads/{self.path(upload_id).name}/"
        bucket = self.location.bucket
        for obj in self.client.list_objects(bucket, prefix=prefix, recursive=True):
            if obj.object_name and not obj.is_dir:
                self.client.remove_object(bucket, obj.object_name)

    def copy(self, source_key: str, key: str, size: int) -> None:
        bucket = self.location.bucket
        if size <= COPY_OBJECT_MAX:
            self.client.copy_object(bucket, key, CopySource(bucket, source_key))
        else:
            self.client.compose_object(bucket, key, [ComposeSource(bucket, source_key)])

    def local_path(self, file_id: str) -> Path | None:
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
        """The object's response (all of it, or `length` bytes from `offset`); a missing
        object is FileNotFoundError, as a missing file is on the directory backend."""
        return self._get_key(self.key(file_id), offset, length)

    def _get_key(self, key: str, offset: int = 0, length: int = 0) -> Any:
        with store_errors("read a file"):
            try:
                return self.client.get_object(
                    self.location.bucket, key, offset=offset, length=length
                )
            except S3Error as exc:
                if exc.code in MISSING:  # named by its key, as a path names a missing file
                    raise FileNotFoundError(errno.ENOENT, "No such object", key) from None
                raise

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


def bucket_problem(storage: S3Storage, endpoint: str | None) -> str | None:
    """Why the bucket cannot hold batchyard's files, or None when it can: checked before
    `serve` starts, so a wrong bucket, endpoint or key is one line, not a traceback."""
    where = f"{storage.describe()} at {endpoint or 'AWS S3'}"
    bucket = storage.location.bucket
    try:
        found = storage.client.bucket_exists(bucket)
    except S3Error as exc:
        return (
            f"The bucket of {where} refused access ({exc.code}: {exc.message}). Check the "
            "AWS credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the "
            "instance role) and the region (AWS_REGION)."
        )
    except Exception as exc:  # connection refused, name not resolved, TLS
        return (
            f"The object store for {where} does not answer: {exc}. Check --s3-endpoint "
            "(BATCHYARD_S3_ENDPOINT) and that the store is running."
        )
    if not found:
        return f"The bucket '{bucket}' does not exist at {endpoint or 'AWS S3'}: create it first."
    probe = f"{storage.location.prefix}tmp/.write-test-{secrets.token_hex(4)}"
    try:
        storage.client.put_object(bucket, probe, io.BytesIO(b"ok"), 2)
        storage.client.remove_object(bucket, probe)
    except S3Error as exc:
        return (
            f"The bucket of {where} refused a test write ({exc.code}: {exc.message}). "
            "Give the credentials s3:PutObject, s3:GetObject and s3:DeleteObject on it."
        )
    return None


__all__ = [
    "JoinedWrite",
    "Location",
    "ObjectStream",
    "ObjectWrite",
    "S3Storage",
    "StoreError",
    "bucket_problem",
    "make_client",
]
