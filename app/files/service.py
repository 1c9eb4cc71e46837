"""The files service: every file the API or the dashboard stores, lists, serves or deletes."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, BinaryIO

from sqlmodel import Session, col, select

from app.config import Settings
from app.db import Database
from app.errors import APIError, invalid, missing, not_found
from app.files.storage import PartialWrite, Storage, Written
from app.tables import Batch, BatchStatus, File, new_id, now
from app.wire.files import EXPIRES_MAX, EXPIRES_MIN, UPLOAD_PURPOSES

#: Purposes the list filter accepts.
ALL_PURPOSES = (*UPLOAD_PURPOSES, "batch_output", "assistants_output", "fine-tune-results")
#: OpenAI: files with purpose=batch expire after 30 days unless told otherwise.
BATCH_FILE_DEFAULT_TTL = 30 * 24 * 3600


def parse_expires_after(anchor: Any, seconds: Any, param: str = "expires_after") -> int:
    """Validate an `expires_after` policy; returns its seconds."""
    if anchor != "created_at":
        raise invalid(f"{param}[anchor] must be 'created_at'.", param=f"{param}[anchor]")
    try:
        value = int(seconds)
    except (TypeError, ValueError):
        raise invalid(f"{param}[seconds] must be an integer.", param=f"{param}[seconds]") from None
    if not EXPIRES_MIN <= value <= EXPIRES_MAX:
        raise invalid(
            f"{param}[seconds] must be between {EXPIRES_MIN} and {EXPIRES_MAX} (30 days); got {value}.",
            param=f"{param}[seconds]",
        )
    return value


class FileService:
    def __init__(self, settings: Settings, db: Database, storage: Storage) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage

    # -- limits -------------------------------------------------------------------------

    def limit_for(self, purpose: str | None) -> int:
        if purpose == "batch":
            return self.settings.max_batch_file_bytes
        return self.settings.max_file_bytes

    def check_purpose(self, purpose: str | None) -> str:
        if not purpose:
            raise missing("purpose")
        if purpose not in UPLOAD_PURPOSES:
            raise invalid(
                f"Invalid purpose '{purpose}'. Expected one of: {', '.join(UPLOAD_PURPOSES)}.",
                param="purpose",
            )
        return purpose

    # -- writes -------------------------------------------------------------------------

    def create(
        self,
        *,
        partial: PartialWrite,
        filename: str,
        purpose: str,
        owner: str,
        expires_after: int | None = None,
        add: bool = True,
    ) -> File:
        """Store an upload that was streamed into `partial` and give it an id.

        `add=False` puts the bytes under the new id and returns the File row unsaved: the
        caller adds it in its own transaction, or deletes the bytes if it does not."""
        limit = self.limit_for(purpose)
        if partial.size > limit:
            partial.discard()
            raise too_large(purpose, limit)
        created = now()
        if expires_after is None and purpose == "batch":
            expires_after = BATCH_FILE_DEFAULT_TTL
        row = File(
            id=partial.file_id or new_id("file-"),
            owner=owner,
            filename=safe_filename(filename),
            purpose=purpose,
            bytes=partial.size,
            sha256=partial.sha256,
            created_at=created,
            expires_at=created + expires_after if expires_after else None,
        )
        partial.commit(row.id)
        if not add:
            return row
        try:
            with self.db.write() as s:
                s.add(row)
        except BaseException:
            self.storage.delete(row.id)
            raise
        return row

    def store(self, source: BinaryIO, *, filename: str, purpose: str, owner: str) -> File:
        """Store what `source` reads (a file on this machine: `batchyard run`'s input or
        sheet) as a File of `purpose`, as an upload of it would be."""
        chunks = iter(functools.partial(source.read, 1 << 20), b"")
        return self.store_chunks(chunks, filename=filename, purpose=purpose, owner=owner)

    def store_chunks(
        self,
        chunks: Iterable[bytes],
        *,
        filename: str,
        purpose: str,
        owner: str,
        empty: APIError | None = None,
    ) -> File:
        """Store the bytes `chunks` gives (a file read, lines made) as a File of `purpose`;
        with `empty`, no bytes at all are refused with that error."""
        # A byte past the limit gets through to create(), which refuses it by purpose.
        partial = self.storage.begin_write(limit=self.limit_for(purpose) + 1)
        try:
            for chunk in chunks:
                partial.write(chunk)
        except BaseException:
            partial.discard()
            raise
        if empty is not None and partial.size == 0:
            partial.discard()
            raise empty
        return self.create(partial=partial, filename=filename, purpose=purpose, owner=owner)

    def register_output(
        self,
        s: Session,
        batch: Batch,
        kind: str,
        written: Written,
        *,
        created_at: int,
        expires_at: int | None,
    ) -> File:
        """The File row of a batch's output or error file (`kind`), whose bytes are already
        stored under `written.file_id`; added in the caller's (the runner's) transaction."""
        row = File(
            id=written.file_id,
            owner=batch.owner,
            filename=f"{batch.id}_{kind}.jsonl",
            purpose="batch_output",
            bytes=written.size,
            sha256=written.sha256,
            created_at=created_at,
            expires_at=expires_at,
        )
        s.add(row)
        return row

    def delete(self, file_id: str, owner: str) -> bool:
        """Delete a file as OpenAI does: at once for the API. The input of a batch that is
        still running keeps its row (marked deleted) and its bytes until the batch ends.
        Returns whether the bytes went now."""
        with self.db.write() as s:
            # Locked: a batch created on another node meanwhile makes this wait.
            row = self._get(s, file_id, owner, lock=True)
            if self._needed_by(s, file_id):
                row.deleted_at = now()
                s.add(row)
                return False
            s.delete(row)
        self.storage.delete(file_id)
        return True

    @staticmethod
    def _needed_by(s: Session, file_id: str) -> str | None:
        """The id of a running batch that reads `file_id`, if any."""
        return s.exec(
            select(Batch.id).where(
                Batch.input_file_id == file_id, col(Batch.status).in_(BatchStatus.ACTIVE)
            )
        ).first()

    def release_deleted(self) -> int:
        """Remove the rows and bytes of deleted files that no running batch reads any more
        (the runner calls this when a batch ends, and on its sweeps); returns how many."""
        with self.db.read() as s:
            marked = s.exec(select(File.id).where(col(File.deleted_at).is_not(None))).all()
        removed = 0
        for file_id in marked:
            with self.db.write() as s:
                row = s.get(File, file_id, with_for_update=True)
                if row is None or self._needed_by(s, file_id):
                    continue
                s.delete(row)
            self.storage.delete(file_id)
            removed += 1
        return removed

    def sweep_expired(self, t: int | None = None) -> int:
        """Delete files whose expires_at has passed by `t` (default: now), as a delete by
        their owner would; then release deleted files no batch needs. Returns how many
        files' bytes were removed."""
        t = now() if t is None else t
        with self.db.read() as s:
            due = s.exec(
                select(File.id, File.owner).where(
                    col(File.expires_at).is_not(None),
                    col(File.expires_at) <= t,
                    col(File.deleted_at).is_(None),
                )
            ).all()
        removed = sum(self.delete(file_id, owner) for file_id, owner in due)
        return removed + self.release_deleted()

    # -- reads --------------------------------------------------------------------------

    def _get(
        self, s: Session, file_id: str, owner: str, *, lock: bool = False, param: str = "file_id"
    ) -> File:
        """The owner's file, or 404 naming `param` (a deleted file is as good as missing)."""
        row = s.get(File, file_id, with_for_update=lock or None)
        if row is None or row.owner != owner or row.deleted_at is not None:
            raise not_found("file", file_id, param=param)
        return row

    def get(self, file_id: str, owner: str) -> File:
        with self.db.read() as s:
            return self._get(s, file_id, owner)

    def content(self, file_id: str, owner: str) -> File:
        """The owner's file, once its bytes are known to be stored (500 if they are not)."""
        row = self.get(file_id, owner)
        if not self.storage.exists(row.id):
            raise APIError(
                500,
                f"The bytes of file '{file_id}' are missing from {self.storage.describe()}.",
                code="file_missing",
            )
        return row

    def list(
        self,
        owner: str,
        *,
        purpose: str | None = None,
        limit: int = 10000,
        after: str | None = None,
        order: str = "desc",
    ) -> tuple[list[File], bool]:
        if purpose is not None and purpose not in ALL_PURPOSES:
            raise invalid(f"Invalid purpose '{purpose}'.", param="purpose")
        if order not in ("asc", "desc"):
            raise invalid("order must be 'asc' or 'desc'.", param="order")
        with self.db.read() as s:
            q = select(File).where(File.owner == owner, col(File.deleted_at).is_(None))
            if purpose:
                q = q.where(File.purpose == purpose)
            if after:
                cursor = self._get(s, after, owner, param="after")
                if order == "desc":
                    q = q.where(col(File.created_ns) < cursor.created_ns)
                else:
                    q = q.where(col(File.created_ns) > cursor.created_ns)
            key = col(File.created_ns)
            q = q.order_by(key.desc() if order == "desc" else key.asc())
            rows = list(s.exec(q.limit(limit + 1)).all())
        return rows[:limit], len(rows) > limit


def too_large(purpose: str | None, limit: int) -> APIError:
    mb = limit / (1024 * 1024)
    what = "Batch input files" if purpose == "batch" else "Files"
    return APIError(
        413,
        f"{what} may be at most {limit} bytes ({mb:g} MB); this upload is larger.",
        param="file",
        code="file_too_large",
    )


def safe_filename(name: str | None) -> str:
    """The name to show and to send back in Content-Disposition: no paths, no controls."""
    name = (name or "upload").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable() and ch not in '"\r\n')
    return name[:255] or "upload"
