"""A block of the shared-prefix context: a long prefix that batch lines share, evaluated once
into a sequence of its own, that lines fork from (shared.py decides, shared_context.py carries
it out).

A leaf, without llama.cpp: the queue's tasks (jobs.py) and the sequences (slots.py) name it,
and shared.py builds on both.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TypeAlias

#: A sequence's cells (positions and K/V) copied out to host memory (native.SharedContext.save).
SavedCells: TypeAlias = "ctypes.Array[ctypes.c_uint8]"


@dataclass(eq=False)
class Block:
    """A shared prefix in a sequence of its own: lines fork from its cells."""

    seq_id: int
    tokens: list[int]
    #: Tokens not yet evaluated; a block gives forks once it has none.
    pending: list[int] = field(default_factory=list)
    pos: int = 0  # tokens of the block in the KV cache
    users: int = 0  # lines forked from it that still run
    used: int = 0  # the admission round of its last fork (the least recent goes first)
    #: Where its first `pos` tokens come from: a block it forks from, or None.
    source: Block | None = None
    #: Out of the stream: its cells saved in `state` (the engine's), its seq_id given up.
    parked: bool = False
    state: SavedCells | None = None

    @property
    def ready(self) -> bool:
        return not self.pending

    @property
    def idle(self) -> bool:
        """In the stream, evaluated, and no line forked from it runs."""
        return not self.users and not self.pending and not self.parked
