"""The uploads service: a file sent in parts (OpenAI's Uploads API), completed into a File.

Parts stream to storage (app/files/multipart.py): under data_dir/uploads/<upload id>/, or
objects under uploads/<upload id>/ in a bucket. They may come in any order and in parallel,
and are joined into the File on complete, read a piece at a time (for the md5 and sha256)
and either written out again or, in a bucket that can, joined there (Storage.begin_join),
so memory stays flat whatever the size. An unfinished upload expires after
`upload_expires_seconds` (an hour); the runner's sweep then removes its parts.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from sqlmodel import Session, col, func, select

from app.config import Settings
from app.db import Database
from app.errors import APIError, invalid, missing, not_found
from app.files.service import FileService, parse_expires_after
from app.files.storage import PartialWrite, Storage
from app.tables import File, Upload, UploadPart, UploadStatus, new_id, now

log = logging.getLogger("batchyard.uploads")

#: Bytes read from a part at a time while completing.
COPY_PIECE = 1 << 20
#: OpenAI's limit on the number of parts in one upload's part_ids.
MAX_PARTS = 10_000


def status_of(upload: Upload, t: int | None = None) -> str:
    """The status to show: a pending upload past its expiry is expired, swept or not."""
    if upload.status == UploadStatus.PENDING and upload.expires_at <= (now() if t is None else t):
        return UploadStatus.EXPIRED
    return upload.status


class UploadService:
    def __init__(
        self, settings: Settings, db: Database, storage: Storage, files: FileService
    ) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage
        self.files = files

    # -- create -------------------------------------------------------------------------

    def create(
        self,
        owner: str,
        *,
        filename: Any,
        purpose: Any,
        bytes: Any,
        mime_type: Any,
        expires_after: dict[str, Any] | None = None,
    ) -> Upload:
        if not isinstance(filename, str) or not filename:
            raise missing("filename")
        purpose = self.files.check_purpose(purpose)
        if not isinstance(mime_type, str) or not mime_type:
            raise missing("mime_type")
        if isinstance(bytes, bool) or not isinstance(bytes, int) or bytes < 1:
            raise invalid(f"bytes must be a positive integer; got {bytes!r}.", param="bytes")
        limit = self.files.limit_for(purpose)
        if bytes > limit:
            what = "batch input files" if purpose == "batch" else "files"
            setting = "max_batch_file_bytes" if purpose == "batch" else "max_file_bytes"
            raise invalid(
                f"bytes is {bytes}, over the limit for {what} of {limit} bytes "
                f"({limit / (1024 * 1024):g} MB, the server's {setting}).",
                param="bytes",
                code="file_too_large",
            )
        file_ttl = None
        if expires_after is not None:
            file_ttl = parse_expires_after(
                expires_after.get("anchor"), expires_after.get("seconds")
            )
        created = now()
        row = Upload(
            id=new_id("upload_"),
            owner=owner,
            filename=filename,
            purpose=purpose,
            bytes=bytes,
            mime_type=mime_type,
            created_at=created,
            expires_at=created + self.settings.upload_expires_seconds,
            file_expires_after=file_ttl,
        )
        with self.db.write() as s:
            s.add(row)
        return row

    # -- reads --------------------------------------------------------------------------

    def get(self, upload_id: str, owner: str) -> Upload:
        with self.db.read() as s:
            return self._find(s, upload_id, owner)

    @staticmethod
    def _find(s: Session, upload_id: str, owner: str, *, lock: bool = False) -> Upload:
        """The owner's upload, or 404 (another owner's is as good as missing). `lock` holds
        its row to the end of a write transaction, so on PostgreSQL two nodes never add
        parts past its `bytes`, or complete and cancel it, at the same time (SQLite's
        writers already take turns)."""
        row = s.get(Upload, upload_id, with_for_update=lock or None)
        if row is None or row.owner != owner:
            raise not_found("upload", upload_id, param="upload_id")
        return row

    def _pending(self, upload: Upload) -> None:
        """Refuse to change an upload that is no longer pending, naming its status."""
        status = status_of(upload)
        if status != UploadStatus.PENDING:
            raise APIError(
                400,
                f"Upload '{upload.id}' is {status}; only a pending upload takes parts, "
                "completes or is cancelled.",
                param="upload_id",
                code=f"upload_{status}",
            )

    # -- parts --------------------------------------------------------------------------

    def check_open(self, upload_id: str, owner: str) -> None:
        """404 or 400 before a part's bytes are read, when the upload cannot take them."""
        self._pending(self.get(upload_id, owner))

    def add_part(self, upload_id: str, owner: str, partial: PartialWrite) -> UploadPart:
        """Keep a streamed part; its bytes may not take the upload past its `bytes`."""
        part_id = partial.part_id or new_id("part_")
        part = UploadPart(id=part_id, upload_id=upload_id, bytes=partial.size)
        path = self.storage.part_path(upload_id, part.id)
        try:
            # The fsync of up to 64 MB goes before the write transaction: on SQLite that
            # holds every writer, and parts sent at once would sync one after the other.
            partial.sync()
            with self.db.write() as s:
                upload = self._find(s, upload_id, owner, lock=True)
                self._pending(upload)
                held = s.exec(
                    select(func.coalesce(func.sum(UploadPart.bytes), 0)).where(
                        UploadPart.upload_id == upload_id
                    )
                ).one()
                if held + partial.size > upload.bytes:
                    raise invalid(
                        f"This part of {partial.size} bytes would take the upload to "
                        f"{held + partial.size} bytes, over the {upload.bytes} bytes it was "
                        "created with.",
                        param="data",
                        code="upload_too_large",
                    )
                # Made under the lock, once the upload is known to be pending: a part refused
                # because another node completed or cancelled it meanwhile (and removed the
                # folder) must not make it again.
                path.parent.mkdir(exist_ok=True)
                partial.commit_to(path)
                s.add(part)
        except BaseException:
            partial.discard()
            path.unlink(missing_ok=True)
            raise
        return part

    # -- complete, cancel, expire ---------------------------------------------------------

    def complete(
        self, upload_id: str, owner: str, part_ids: list[str], md5: str | None = None
    ) -> tuple[Upload, File]:
        """Join the listed parts, in order, into a File; the upload becomes completed."""
        upload = self.get(upload_id, owner)
        self._pending(upload)
        parts = self._listed_parts(upload, part_ids)
        partial = self._join(upload, owner, parts, md5)
        file = self.files.create(
            partial=partial,
            filename=upload.filename,
            purpose=upload.purpose,
            owner=owner,
            expires_after=upload.file_expires_after,
            add=False,
        )
        fresh = self._commit(upload_id, owner, file)
        self.storage.delete_parts(upload_id)
        log.info("upload=%s status=completed file=%s bytes=%d", upload_id, file.id, file.bytes)
        return fresh, file

    def _listed_parts(self, upload: Upload, part_ids: list[str]) -> list[UploadPart]:
        """The parts `part_ids` names, in its order: at least one, at most MAX_PARTS, none
        twice, each added to this upload, together exactly the upload's bytes."""
        if not part_ids:
            raise missing("part_ids")
        if len(part_ids) > MAX_PARTS:
            raise invalid(
                f"part_ids may list at most {MAX_PARTS} parts; got {len(part_ids)}.",
                param="part_ids",
            )
        if len(set(part_ids)) != len(part_ids):
            raise invalid("part_ids lists a part more than once.", param="part_ids")
        with self.db.read() as s:
            added = {
                p.id: p
                for p in s.exec(select(UploadPart).where(UploadPart.upload_id == upload.id)).all()
            }
        for pid in part_ids:
            if pid not in added:
                raise invalid(
                    f"No part '{pid}' was added to upload '{upload.id}'.", param="part_ids"
                )
        parts = [added[pid] for pid in part_ids]
        total = sum(p.bytes for p in parts)
        if total != upload.bytes:
            raise invalid(
                f"The listed parts hold {total} bytes; upload '{upload.id}' was created "
                f"with bytes={upload.bytes}.",
                param="part_ids",
                code="upload_size_mismatch",
            )
        return parts

    def _join(
        self, upload: Upload, owner: str, parts: list[UploadPart], md5: str | None
    ) -> PartialWrite:
        """The parts' bytes, in order, written into one new file (not yet committed), its
        md5 checked against `md5` when one was sent. Where the store joins the parts itself
        (S3's UploadPartCopy) they are still read, once: md5 and sha256 are not digests
        that parts' digests combine into, and the order is known only now."""
        limit = self.files.limit_for(upload.purpose)
        listed = [(p.id, p.bytes) for p in parts]
        partial = self.storage.begin_join(upload.id, listed, limit) or self.storage.begin_write(
            limit
        )
        try:
            digest = hashlib.md5(usedforsecurity=False)
            for part in parts:
                with self.storage.open_part(upload.id, part.id) as fh:
                    while piece := fh.read(COPY_PIECE):
                        digest.update(piece)
                        partial.write(piece)
            if md5 is not None and md5.lower() != digest.hexdigest():
                raise invalid(
                    f"md5 {md5} does not match the parts' md5 {digest.hexdigest()}; "
                    "the upload stays pending.",
                    param="md5",
                    code="md5_mismatch",
                )
        except FileNotFoundError:
            # Another complete (or a cancel) of this upload finished first and removed the
            # parts: say what became of the upload rather than fail with a 500.
            partial.discard()
            self._pending(self.get(upload.id, owner))
            raise
        except BaseException:
            partial.discard()
            raise
        return partial

    def _commit(self, upload_id: str, owner: str, file: File) -> Upload:
        """Add the File row and mark the upload completed, in one transaction, if it is
        still pending; else the file goes and the refusal names what became of the upload.

        Together, so no reader ever sees a file that a cancel (or the expiry) in between
        would take away again.
        """
        try:
            with self.db.write() as s:
                fresh = self._find(s, upload_id, owner, lock=True)
                still_pending = status_of(fresh) == UploadStatus.PENDING
                if still_pending:
                    s.add(file)
                    fresh.status = UploadStatus.COMPLETED
                    fresh.file_id = file.id
                    s.add(fresh)
        except BaseException:
            self.storage.delete(file.id)
            raise
        if not still_pending:  # cancelled or expired meanwhile
            self.storage.delete(file.id)
            self._pending(fresh)  # raises, naming what became of the upload
        return fresh

    def cancel(self, upload_id: str, owner: str) -> Upload:
        with self.db.write() as s:
            upload = self._find(s, upload_id, owner, lock=True)
            self._pending(upload)
            upload.status = UploadStatus.CANCELLED
            s.add(upload)
        self.storage.delete_parts(upload_id)
        return upload

    def sweep_expired(self, t: int | None = None) -> int:
        """Mark pending uploads past their expiry expired and remove their parts."""
        t = now() if t is None else t
        with self.db.write() as s:
            due = list(
                s.exec(
                    select(Upload).where(
                        Upload.status == UploadStatus.PENDING, col(Upload.expires_at) <= t
                    )
                ).all()
            )
            for upload in due:
                upload.status = UploadStatus.EXPIRED
                s.add(upload)
        for upload in due:
            self.storage.delete_parts(upload.id)
            log.info("upload=%s status=expired", upload.id)
        self._sweep_leftover_parts()
        return len(due)

    def _sweep_leftover_parts(self) -> None:
        """Remove part folders of uploads that are no longer pending (a crash between the
        status change and the removal leaves them) or that have no row at all."""
        folders = self.storage.upload_folders()
        if not folders:
            return
        with self.db.read() as s:
            pending = set(
                s.exec(
                    select(Upload.id).where(
                        col(Upload.id).in_(folders), Upload.status == UploadStatus.PENDING
                    )
                ).all()
            )
        for name in folders:
            if name not in pending:
                try:
                    self.storage.delete_parts(name)
                except ValueError:  # not a name batchyard made: leave it alone
                    log.warning("uploads folder holds %r, which is not an upload", name)
