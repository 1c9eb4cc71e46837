"""An S3-compatible bucket as batchyard reaches it: where its objects are, the client, and
what the store's failures mean.

`Location` is `--files-url s3://BUCKET/PREFIX`; `make_client` a `minio` client with the
AWS credential chain; a `Bucket` names the objects under the prefix (`files/<file id>`,
`uploads/<upload id>/<part id>`), reads and copies them; `store_errors` turns the store's
failures into OSErrors, as a disk's are; `bucket_problem` is `serve`'s check before it
starts. The storage over it is s3.py, its writes bucket_writes.py.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
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
from minio.error import MinioException, S3Error

from app.files.storage import checked_id

#: The error codes of an object that is not there.
MISSING = ("NoSuchKey", "NoSuchObject", "ResourceNotFound")
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


class Bucket:
    """The objects batchyard keeps in one bucket, under its location's prefix."""

    def __init__(self, client: Minio, location: Location) -> None:
        self.client = client
        self.location = location

    @property
    def name(self) -> str:
        return self.location.bucket

    def describe(self) -> str:
        return f"s3://{self.location.bucket}/{self.location.prefix}"

    def key(self, file_id: str) -> str:
        """The key of a file's bytes."""
        return f"{self.location.prefix}files/{checked_id(file_id)}"

    def part_key(self, upload_id: str, part_id: str) -> str:
        """The key of an Uploads API part."""
        return f"{self.uploads_prefix(upload_id)}{checked_id(part_id)}"

    def uploads_prefix(self, upload_id: str | None = None) -> str:
        """The prefix of every upload's parts, or of one upload's."""
        upload = f"{checked_id(upload_id)}/" if upload_id is not None else ""
        return f"{self.location.prefix}uploads/{upload}"

    def get(self, key: str, offset: int = 0, length: int = 0) -> Any:
        """The object's response (all of it, or `length` bytes from `offset`); a missing
        object is FileNotFoundError, as a missing file is on the directory backend."""
        with store_errors("read a file"):
            try:
                return self.client.get_object(self.name, key, offset=offset, length=length)
            except S3Error as exc:
                if exc.code in MISSING:  # named by its key, as a path names a missing file
                    raise FileNotFoundError(errno.ENOENT, "No such object", key) from None
                raise

    def copy(self, source_key: str, key: str, size: int) -> None:
        """Copy an object in the store, without its bytes coming through this node."""
        if size <= COPY_OBJECT_MAX:
            self.client.copy_object(self.name, key, CopySource(self.name, source_key))
        else:
            self.client.compose_object(self.name, key, [ComposeSource(self.name, source_key)])


def bucket_problem(store: Bucket, endpoint: str | None) -> str | None:
    """Why the bucket cannot hold batchyard's files, or None when it can: checked before
    `serve` starts, so a wrong bucket, endpoint or key is one line, not a traceback."""
    where = f"{store.describe()} at {endpoint or 'AWS S3'}"
    bucket = store.name
    try:
        found = store.client.bucket_exists(bucket)
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
    probe = f"{store.location.prefix}tmp/.write-test-{secrets.token_hex(4)}"
    try:
        store.client.put_object(bucket, probe, io.BytesIO(b"ok"), 2)
        store.client.remove_object(bucket, probe)
    except S3Error as exc:
        return (
            f"The bucket of {where} refused a test write ({exc.code}: {exc.message}). "
            "Give the credentials s3:PutObject, s3:GetObject and s3:DeleteObject on it."
        )
    return None


__all__ = [
    "MISSING",
    "Bucket",
    "Location",
    "ObjectStream",
    "StoreError",
    "bucket_problem",
    "make_client",
    "store_errors",
]
