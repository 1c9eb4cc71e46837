"""`batch.reasoning_tokens`: the sum of its lines' reasoning tokens, for the Batch's
`usage.output_tokens_details.reasoning_tokens` (0 for a batch that ran before it).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("reasoning_tokens", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.drop_column("reasoning_tokens")
