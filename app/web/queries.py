"""Reads the dashboard needs that the services do not offer: one query for many batches."""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import col, select

from app.db import Database
from app.models import Batch


def batches_by_ids(db: Database, owner: str, ids: Sequence[str]) -> dict[str, Batch]:
    """The owner's batches among `ids`, by id, in one read (the live list polls this)."""
    if not ids:
        return {}
    with db.read() as s:
        rows = s.exec(select(Batch).where(Batch.owner == owner, col(Batch.id).in_(list(ids)))).all()
    return {b.id: b for b in rows}
