"""The garbage collector and a long-running node: what start-up made, frozen out of its sight.

A node's start-up leaves about 150,000 objects that live as long as the process (modules,
classes, the app, SQLAlchemy's and Litestar's tables). Python's oldest-generation collection
walks all of them, with the GIL held, about once a second while the runner turns lines
over: 45-70 ms each, during which the API answered nobody and the upstream client read no
answers (bench/fleet.py: those pauses were the API's p99 while a node pushed its lines).
`gc.freeze()` moves them to a generation the collector never walks; what the node makes
afterwards is still collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup() -> None:
    """Collect once, then keep every object alive now out of future collections. Call it
    once, when a process has started what lives as long as it (not in tests, which build
    many apps in one process: their leftovers would never be collected)."""
    gc.collect()
    gc.freeze()
