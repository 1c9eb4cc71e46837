"""The one table of service tiers: what each runs at and names, and what a refusal says."""

from __future__ import annotations

from typing import get_args, get_type_hints

import pytest

from app.engine.base import EngineError, Priority
from app.engine.tiers import SERVICE_TIERS, service_tier
from app.errors import APIError
from app.wire.inference import ChatCompletion


def test_each_tier_runs_at_its_priority_and_names_what_it_ran_at() -> None:
    assert service_tier(None) is None
    ran = {t: (tier.priority, tier.named) for t in SERVICE_TIERS if (tier := service_tier(t))}
    assert ran == {
        "auto": (Priority.ONLINE, "default"),
        "default": (Priority.ONLINE, "default"),
        "flex": (Priority.BATCH, "flex"),
    }
    # Every tier an answer names is one the answer's wire type allows.
    named = get_args(get_args(get_type_hints(ChatCompletion)["service_tier"])[0])
    assert {v[1] for v in ran.values()} <= set(named)


@pytest.mark.parametrize("cls", [APIError, EngineError])
def test_any_other_tier_is_a_400_listing_the_allowed_ones(cls: type[APIError]) -> None:
    with pytest.raises(cls) as caught:
        service_tier("priority", cls=cls)
    err = caught.value
    assert (err.status_code, err.param, err.code) == (400, "service_tier", "invalid_value")
    assert "'auto', 'default', 'flex'" in err.message
