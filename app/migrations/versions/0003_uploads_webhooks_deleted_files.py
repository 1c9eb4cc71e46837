"""Uploads, webhook deliveries, deleted files that a running batch still reads, cached tokens.

- `upload` and `uploadpart`: the Uploads API (a file sent in parts).
- `webhookdelivery`: batch events and their delivery attempts, so a restart loses none.
- `file.deleted_at`: a file deleted while a running batch reads it stays until the batch ends.
- `batch.cached_tokens`, `request.cached_tokens`: prefix-cache hits, summed per batch
  (0 for rows written before this revision).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "upload",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("filename", sa.String(), nullable=False),
        sa.Column("purpose", sa.String(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("mime_type", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.Integer(), nullable=False),
        sa.Column("file_expires_after", sa.Integer(), nullable=True),
        sa.Column("file_id", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("upload", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_upload_expires_at"), ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_upload_owner"), ["owner"], unique=False)
        batch_op.create_index(batch_op.f("ix_upload_status"), ["status"], unique=False)

    op.create_table(
        "webhookdelivery",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("event_id", sa.String(), nullable=False),
        sa.Column("event_type", sa.String(), nullable=False),
        sa.Column("batch_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("url", sa.String(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=True),
        sa.Column("last_attempt_at", sa.Integer(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("delivered_at", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("webhookdelivery", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhookdelivery_batch_id"), ["batch_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_webhookdelivery_event_id"), ["event_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_webhookdelivery_next_attempt_at"), ["next_attempt_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_webhookdelivery_owner"), ["owner"], unique=False)
        batch_op.create_index(batch_op.f("ix_webhookdelivery_status"), ["status"], unique=False)

    op.create_table(
        "uploadpart",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("upload_id", sa.String(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["upload_id"], ["upload.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("uploadpart", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_uploadpart_upload_id"), ["upload_id"], unique=False)

    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cached_tokens", sa.Integer(), nullable=False, server_default="0")
        )

    with op.batch_alter_table("file", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deleted_at", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_file_deleted_at"), ["deleted_at"], unique=False)

    with op.batch_alter_table("request", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cached_tokens", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("request", schema=None) as batch_op:
        batch_op.drop_column("cached_tokens")

    with op.batch_alter_table("file", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_file_deleted_at"))
        batch_op.drop_column("deleted_at")

    with op.batch_alter_table("batch", schema=None) as batch_op:
        batch_op.drop_column("cached_tokens")

    with op.batch_alter_table("uploadpart", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_uploadpart_upload_id"))

    op.drop_table("uploadpart")
    with op.batch_alter_table("webhookdelivery", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_webhookdelivery_status"))
        batch_op.drop_index(batch_op.f("ix_webhookdelivery_owner"))
        batch_op.drop_index(batch_op.f("ix_webhookdelivery_next_attempt_at"))
        batch_op.drop_index(batch_op.f("ix_webhookdelivery_event_id"))
        batch_op.drop_index(batch_op.f("ix_webhookdelivery_batch_id"))

    op.drop_table("webhookdelivery")
    with op.batch_alter_table("upload", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_upload_status"))
        batch_op.drop_index(batch_op.f("ix_upload_owner"))
        batch_op.drop_index(batch_op.f("ix_upload_expires_at"))

    op.drop_table("upload")
