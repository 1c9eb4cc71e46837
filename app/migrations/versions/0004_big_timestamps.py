"""64-bit `*_at` timestamps: unix seconds pass PostgreSQL's 32-bit INTEGER in January 2038.

A batch or file made in 2037 with a year's expiry would already fail to store. As in 0002,
SQLite's INTEGER is 64-bit already, so there this changes nothing and copies no table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: (table, column, nullable) for every integer timestamp column; all become BIGINT.
COLUMNS = (
    ("file", "created_at", False),
    ("file", "expires_at", True),
    ("file", "deleted_at", True),
    ("batch", "created_at", False),
    ("batch", "expires_at", True),
    ("batch", "in_progress_at", True),
    ("batch", "finalizing_at", True),
    ("batch", "completed_at", True),
    ("batch", "failed_at", True),
    ("batch", "expired_at", True),
    ("batch", "cancelling_at", True),
    ("batch", "cancelled_at", True),
    ("request", "claimed_at", True),
    ("request", "finished_at", True),
    ("upload", "created_at", False),
    ("upload", "expires_at", False),
    ("uploadpart", "created_at", False),
    ("webhookdelivery", "created_at", False),
    ("webhookdelivery", "last_attempt_at", True),
    ("webhookdelivery", "delivered_at", True),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.BigInteger(), existing_nullable=nullable)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.Integer(), existing_nullable=nullable)
