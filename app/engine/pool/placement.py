"""Placement: the memory budget and the bytes each loaded model holds in it.

Pure bookkeeping, no clock and no llama.cpp: one reservation per loaded (or loading)
model, first its estimate and, once the model is loaded, the bytes it was measured to
take. A reservation is made when a load is decided and released only once the engine
has closed, so two loads never both count on the same free bytes. The plan reads each
model's reservation in its snapshot (plan.py `BerthState.reserved`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class Reservation:
    """The bytes one model holds (or will hold once loaded)."""

    bytes: int
    measured: bool = False  # False: still the estimate


class Placement:
    """The budget in bytes and the reservations in it, by the pool's key of each model."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.reservations: dict[Hashable, Reservation] = {}

    def reserved(self) -> int:
        """Bytes held by every model loaded or loading."""
        return sum(r.bytes for r in self.reservations.values())

    def held(self, model: Hashable) -> int:
        """The bytes `model` holds now: 0 when it holds none."""
        r = self.reservations.get(model)
        return r.bytes if r is not None else 0

    def reserve(self, model: Hashable, need: int) -> None:
        self.reservations[model] = Reservation(need)

    def measured(self, model: Hashable, size: int) -> None:
        """The model is loaded and takes `size` bytes: its reservation becomes that."""
        r = self.reservations.get(model)
        if r is not None:
            r.bytes, r.measured = size, True

    def release(self, model: Hashable) -> None:
        """The model's engine has closed: its bytes are free again."""
        self.reservations.pop(model, None)
