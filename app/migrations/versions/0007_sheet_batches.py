"""The `sheetbatch` table: what a batch made from a sheet was made of, for its download.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sheetbatch",
        sa.Column("batch_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("sheet_file_id", sa.String(), nullable=False),
        sa.Column("filename", sa.String(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batch.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    with op.batch_alter_table("sheetbatch", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sheetbatch_owner"), ["owner"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sheetbatch", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sheetbatch_owner"))
    op.drop_table("sheetbatch")
