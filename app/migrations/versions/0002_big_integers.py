"""64-bit columns where 0.1.0's values outgrow PostgreSQL's 32-bit INTEGER.

created_ns holds time.time_ns() (about 1.8e18): 0.1.0's tables could not take a single
file or batch on PostgreSQL. File sizes and line offsets pass 2 GiB with raised limits.
SQLite's INTEGER is already 64-bit, so there this changes nothing and copies no table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: (table, column) pairs that become BIGINT.
COLUMNS = (
    ("file", "created_ns"),
    ("file", "bytes"),
    ("batch", "created_ns"),
    ("request", "offset"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.BigInteger(), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.Integer(), existing_nullable=False)
