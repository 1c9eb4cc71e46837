"""Alembic revisions, one module each, named NNNN_what.py; see ../README.md."""
