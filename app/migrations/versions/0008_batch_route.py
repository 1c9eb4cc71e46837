"""`batch.route`: the id of the model a batch's lines run on, resolved once at validation.

A batch validated before this revision has none (NULL): each node's runner resolves its
`model` to an id at start (app/batches/lifecycle/lifecycle.py: route_unrouted), as validation now does, before any of
its lines is claimed again. No line of it is claimed meanwhile by a node with several lanes.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.add_column(sa.Column("route", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.drop_column("route")
