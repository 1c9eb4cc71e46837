"""The nodes on one database and the model names each serves (`node`, `nodemodel`).

Several nodes on one PostgreSQL may hold different models: each publishes its catalog's
names, so that a line goes to a node that holds its model (app/batches/nodes.py).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "nodemodel",
        sa.Column("node_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("model_id", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node_id", "name"),
    )


def downgrade() -> None:
    op.drop_table("nodemodel")
    op.drop_table("node")
