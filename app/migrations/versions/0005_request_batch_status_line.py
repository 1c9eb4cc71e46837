"""The lines' (batch_id, status, line) index, in place of (batch_id, status).

The fair claim (app/batches/claims/claims.py) reads, for each batch in progress, its first pending
line and the pending lines just after it: with `line` in the index both are a short range
of it, instead of every pending line of the batch sorted. Every query that used the
(batch_id, status) index uses this one's prefix.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_request_batch_status_line", "request", ["batch_id", "status", "line"])
    op.drop_index("ix_request_batch_status", table_name="request")


def downgrade() -> None:
    op.create_index("ix_request_batch_status", "request", ["batch_id", "status"])
    op.drop_index("ix_request_batch_status_line", table_name="request")
