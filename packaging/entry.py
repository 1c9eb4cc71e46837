"""The single binary's entry point: the same `main` as the `batchyard` console script."""

from __future__ import annotations

import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    # The engine's CPU check runs in a spawned child, which a frozen app starts as itself.
    multiprocessing.freeze_support()
    sys.exit(main())
