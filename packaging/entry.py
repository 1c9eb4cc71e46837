"""The single binary's entry point: the same `main` as the `batchyard` console script."""

from __future__ import annotations

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
