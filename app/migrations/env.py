"""Alembic's environment: runs the revisions on the connection `Database.migrate()` hands it.

There is no alembic.ini: the app configures Alembic in code (app/db.py), so the same
revisions run from a checkout, an installed wheel and the single binary. `alembic` on the
command line is not needed to add a revision either (see README.md next to this file).
"""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from app import tables  # noqa: F401  (registers the tables)
from app.migrations import compare_type

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    # SQLite alters a table by copying it; Alembic's batch mode does that for us.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=compare_type,
)
with context.begin_transaction():
    context.run_migrations()
