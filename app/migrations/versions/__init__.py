"""Alembic revisions, one module each, numbered in order (0001_tables_of_0_1_0.py); see ../README.md."""
