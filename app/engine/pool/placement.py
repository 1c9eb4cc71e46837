"""Placement: which loaded models the memory budget holds, and which to unload for room.

Pure bookkeeping, no clock and no llama.cpp: one reservation per loaded (or loading)
model, first its estimate and, once the model is loaded, the bytes it was measured to
take. A reservation is made when a load is decided and released only once the engine
has closed, so two loads never both count on the same free bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.catalog import Estimate


@dataclass
class Reservation:
    """The bytes one model holds (or will hold once loaded)."""

    bytes: int
    measured: bool = False  # False: still the estimate
    last_used: float = 0.0
    in_flight: int = 0
    #: A pinned model is never a victim (the TTL and the LRU pass it by).
    pinned: bool = False


class Placement:
    """The budget in bytes and the reservations in it, by model id."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.reservations: dict[str, Reservation] = {}

    def reserved(self) -> int:
        """Bytes held by every model loaded or loading."""
        return sum(r.bytes for r in self.reservations.values())

    def free(self) -> int:
        return self.budget - self.reserved()

    def fits(self, need: int) -> bool:
        """Whether `need` more bytes fit beside what is reserved now."""
        return self.reserved() + need <= self.budget

    def reserve(self, model: str, need: int, *, now: float = 0.0) -> None:
        self.reservations[model] = Reservation(need, last_used=now)

    def measured(self, model: str, size: int) -> None:
        """The model is loaded and takes `size` bytes: its reservation becomes that."""
        r = self.reservations.get(model)
        if r is not None:
            r.bytes, r.measured = size, True

    def release(self, model: str) -> None:
        """The model's engine has closed: its bytes are free again."""
        self.reservations.pop(model, None)

    def touch(self, model: str, now: float) -> None:
        r = self.reservations.get(model)
        if r is not None:
            r.last_used = max(r.last_used, now)

    def set_in_flight(self, model: str, n: int) -> None:
        r = self.reservations.get(model)
        if r is not None:
            r.in_flight = n

    def victims(self, need: int, *, exclude: frozenset[str] = frozenset()) -> list[str] | None:
        """The models to unload so that `need` more bytes fit: least recently used first,
        only among models with nothing in flight and not pinned. [] when it fits already;
        None when unloading every such model would still not make the room."""
        short = self.reserved() + need - self.budget
        if short <= 0:
            return []
        out: list[str] = []
        for model, r in sorted(self.reservations.items(), key=lambda kv: kv[1].last_used):
            if r.in_flight or r.pinned or model in exclude:
                continue
            out.append(model)
            short -= r.bytes
            if short <= 0:
                return out
        return None


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
