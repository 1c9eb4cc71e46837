"""Placement: the memory budget and the bytes each loaded model holds in it, and how many
of a model's layers the free VRAM holds.

Pure bookkeeping, no clock and no llama.cpp: one reservation per loaded (or loading)
model, first its estimate and, once the model is loaded, the bytes it was measured to
take. A reservation is made when a load is decided and released only once the engine
has closed, so two loads never both count on the same free bytes. The plan reads each
model's reservation in its snapshot (plan.py `Model.reserved`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from app.catalog import Estimate


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


def gpu_layers(n_layer: int, estimate: Estimate | None, free_vram: int | None, margin: int) -> int:
    """--n-gpu-layers auto for one model: as many of its layers as the free VRAM holds, as
    llama.cpp's --fit does (it keeps --fit-target, 1 GiB, free on each device: `margin`).

    The compute buffer goes first; each layer then takes an equal share of the weights and
    the KV cache, the output layer counted as one more (-1, all, offloads it too). 0 without
    a GPU (`free_vram` None); -1 with no estimate to go by (the file's header unread: its
    load fails with the reason anyway)."""
    if free_vram is None:
        return 0
    if estimate is None or n_layer <= 0:
        return -1
    room = free_vram - margin - estimate.compute
    per_layer = (estimate.weights + estimate.kv_cache) / (n_layer + 1)
    fit = int(room // per_layer) if room > 0 else 0
    return -1 if fit > n_layer else fit
