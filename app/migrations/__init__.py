"""Alembic migrations for both databases; `Database.migrate()` applies them at start-up (see README)."""

from __future__ import annotations

from typing import Any


def compare_type(
    context: Any,
    inspected: Any,  # noqa: ARG001 - Alembic's signature
    metadata: Any,  # noqa: ARG001
    inspected_type: Any,
    metadata_type: Any,
) -> bool | None:
    """Alembic's type comparison, except that SQLite's INTEGER is BIGINT (both are 64-bit
    there, and revision 0002 leaves SQLite's columns alone)."""
    if context.dialect.name == "sqlite":
        names = {type(inspected_type).__name__.upper(), type(metadata_type).__name__.upper()}
        if names <= {"INTEGER", "BIGINTEGER", "BIGINT"}:
            return False
    return None  # Alembic's own comparison
