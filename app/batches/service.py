"""The batches service: create, read, list and cancel batches (their wire shape: api/schemas)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from app.config import Settings
from app.db import Database
from app.engine.base import ENDPOINTS
from app.errors import APIError, invalid, missing, not_found
from app.files.service import parse_expires_after
from app.models import Batch, BatchStatus, File, Request, RequestStatus, new_id, now

if TYPE_CHECKING:
    from app.batches.runner import Runner

COMPLETION_WINDOWS = ("24h",)
METADATA_MAX_PAIRS, METADATA_KEY_MAX, METADATA_VALUE_MAX = 16, 64, 512


def check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise invalid(
            "metadata must be an object of string keys and string values.", param="metadata"
        )
    if len(metadata) > METADATA_MAX_PAIRS:
        raise invalid(
            f"metadata may hold at most {METADATA_MAX_PAIRS} pairs; got {len(metadata)}.",
            param="metadata",
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise invalid("metadata keys and values must be strings.", param=f"metadata.{key}")
        if len(key) > METADATA_KEY_MAX:
            raise invalid(
                f"metadata keys may be at most {METADATA_KEY_MAX} characters; '{key[:20]}…' has {len(key)}.",
                param="metadata",
            )
        if len(value) > METADATA_VALUE_MAX:
            raise invalid(
                f"metadata values may be at most {METADATA_VALUE_MAX} characters; the value of '{key}' has {len(value)}.",
                param=f"metadata.{key}",
            )
    return metadata


class BatchService:
    def __init__(self, settings: Settings, db: Database, runner: Runner) -> None:
        self.settings = settings
        self.db = db
        self.runner = runner

    def create(
        self,
        owner: str,
        input_file_id: Any,
        endpoint: Any,
        completion_window: Any = "24h",
        metadata: Any = None,
        output_expires_after: Any = None,
    ) -> Batch:
        if not input_file_id or not isinstance(input_file_id, str):
            raise missing("input_file_id")
        if endpoint not in ENDPOINTS:
            raise invalid(
                f"Invalid endpoint {json.dumps(endpoint)}. Supported endpoints: {', '.join(ENDPOINTS)}.",
                param="endpoint",
            )
        if completion_window not in COMPLETION_WINDOWS:
            raise invalid(
                f"Invalid completion_window {json.dumps(completion_window)}. Supported: '24h'.",
                param="completion_window",
            )
        meta = check_metadata(metadata)
        out_ttl = None
        if output_expires_after is not None:
            if not isinstance(output_expires_after, dict):
                raise invalid(
                    "output_expires_after must be an object.", param="output_expires_after"
                )
            out_ttl = parse_expires_after(
                output_expires_after.get("anchor"),
                output_expires_after.get("seconds"),
                "output_expires_after",
            )
        created = now()
        with self.db.write() as s:
            # Locked, so that a delete on another node waits for this batch to exist.
            f = s.get(File, input_file_id, with_for_update=True)
            if f is None or f.owner != owner or f.deleted_at is not None:
                raise APIError(
                    400,
                    f"The input file '{input_file_id}' does not exist.",
                    param="input_file_id",
                    code="file_not_found",
                )
            if f.purpose != "batch":
                raise invalid(
                    f"The input file '{input_file_id}' has purpose '{f.purpose}'; a batch needs a file "
                    "uploaded with purpose 'batch'.",
                    param="input_file_id",
                )
            batch = Batch(
                id=new_id("batch_"),
                owner=owner,
                endpoint=endpoint,
                input_file_id=input_file_id,
                completion_window=completion_window,
                status=BatchStatus.VALIDATING,
                metadata_json=json.dumps(meta) if meta is not None else None,
                output_expires_after=out_ttl,
                created_at=created,
                expires_at=created + self.settings.batch_window_seconds,
            )
            s.add(batch)
        self.runner.wake()
        return batch

    def get(self, batch_id: str, owner: str) -> Batch:
        with self.db.read() as s:
            b = s.get(Batch, batch_id)
            if b is None or b.owner != owner:
                raise not_found("batch", batch_id, param="batch_id")
            return b

    def get_many(self, owner: str, ids: Sequence[str]) -> dict[str, Batch]:
        """The owner's batches among `ids`, by id, in one read (the live list polls this)."""
        if not ids:
            return {}
        with self.db.read() as s:
            rows = s.exec(
                select(Batch).where(Batch.owner == owner, col(Batch.id).in_(list(ids)))
            ).all()
        return {b.id: b for b in rows}

    def list(
        self, owner: str, *, limit: int = 20, after: str | None = None
    ) -> tuple[list[Batch], bool]:
        with self.db.read() as s:
            q = select(Batch).where(Batch.owner == owner)
            if after:
                cursor = s.get(Batch, after)
                if cursor is None or cursor.owner != owner:
                    raise not_found("batch", after, param="after")
                q = q.where(col(Batch.created_ns) < cursor.created_ns)
            q = q.order_by(col(Batch.created_ns).desc()).limit(limit + 1)
            rows = list(s.exec(q).all())
        return rows[:limit], len(rows) > limit

    def cancel(self, batch_id: str, owner: str) -> Batch:
        self.get(batch_id, owner)  # 404 for another owner's batch
        return self.runner.cancel(batch_id)

    def results(self, batch_id: str, owner: str, limit: int = 50) -> list[dict[str, Any]]:
        """The first finished lines of a batch, for the dashboard."""
        self.get(batch_id, owner)
        with self.db.read() as s:
            rows = s.exec(
                select(Request)
                .where(Request.batch_id == batch_id, col(Request.status).in_(RequestStatus.DONE))
                .order_by(col(Request.line))
                .limit(limit)
            ).all()
        return [
            {
                "line": r.line,
                "custom_id": r.custom_id,
                "status": r.status,
                "status_code": r.status_code,
                "body": json.loads(r.body_json) if r.body_json else None,
                "error": json.loads(r.error_json) if r.error_json else None,
            }
            for r in rows
        ]
