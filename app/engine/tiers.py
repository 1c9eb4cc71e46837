"""Service tiers: which `service_tier`s a chat or Responses body may name, the priority each
runs at, and the tier its answer names. The one home of that rule: the online endpoints and
the embedded engine's batch lines (chat and Responses alike) read it here.

The names are the wire's `ServiceTier` (what /schema documents). `flex` runs at batch
priority, behind online requests and among the batch lines the engine holds; `auto` and
`default` run as online requests do and their answer says `default`. A batch line runs at
batch priority whatever it names; its tier is checked all the same, so a line is refused
for what the online endpoint refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from app.engine.base import Priority
from app.errors import APIError, invalid
from app.wire.inference import ServiceTier

E = TypeVar("E", bound=APIError)

#: The tiers a body may name, in the order a refusal lists them.
SERVICE_TIERS: tuple[str, ...] = get_args(ServiceTier)
FLEX = "flex"


@dataclass(frozen=True)
class Tier:
    #: The priority an online request of this tier runs at.
    priority: Priority
    #: The tier its answer names: `default` or `flex`.
    named: str


def service_tier(value: Any, *, cls: type[E] = APIError) -> Tier | None:  # type: ignore[assignment]
    """The tier a body's `service_tier` value asks for, None when it names none; any other
    value is a 400 (`invalid_value`, param `service_tier`) that lists the allowed ones."""
    if value is None:
        return None
    if value not in SERVICE_TIERS:
        allowed = ", ".join(f"'{t}'" for t in SERVICE_TIERS)
        raise invalid(
            f"service_tier {value!r} is not offered here; use one of {allowed}.",
            param="service_tier",
            cls=cls,
        )
    if value == FLEX:
        return Tier(Priority.BATCH, FLEX)
    return Tier(Priority.ONLINE, "default")
