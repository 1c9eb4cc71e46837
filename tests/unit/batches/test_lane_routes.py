"""Lane matching, one rule (claims.lane_takes) in Python and in the claim's SQL (`_routed`):
played on the same generated batches, the two pick the same ones; and the queue health's
`lane_of` names a lane that takes the route."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, insert, select

from app.batches.claims.claims import _routed, lane_takes
from app.batches.claims.health import lane_of
from app.engine.node import UNROUTED, Lane
from app.tables import Batch

ROUTES = st.sampled_from(["", "smollm2", "gemma3:270m", "Gemma3:270m", "llama3:latest"])


@pytest.fixture(scope="module")
def db() -> Iterator[Engine]:
    engine = create_engine("sqlite://")
    Batch.__table__.create(engine)  # type: ignore[attr-defined]
    yield engine
    engine.dispose()


@settings(max_examples=60, deadline=None)
@given(
    routes=st.none() | st.frozensets(ROUTES, max_size=3),
    batch_routes=st.lists(st.none() | ROUTES, max_size=8),
)
def test_the_sql_takes_the_batches_the_rule_takes(
    db: Engine, routes: frozenset[str] | None, batch_routes: list[str | None]
) -> None:
    table = Batch.__table__  # type: ignore[attr-defined]
    rows = [
        {"id": f"batch_{i}", "endpoint": "/v1/chat/completions", "input_file_id": "f", "route": r}
        for i, r in enumerate(batch_routes)
    ]
    with db.begin() as c:
        c.execute(table.delete())
        if rows:
            c.execute(insert(table), rows)
        query = select(table.c.id)
        where = _routed(routes)
        if where is not None:
            query = query.where(where)
        by_sql = set(c.execute(query).scalars())
    by_rule = {row["id"] for row in rows if lane_takes(routes, row["route"])}
    assert by_sql == by_rule


def test_lane_of_prefers_a_lane_of_named_routes_to_one_of_every_line() -> None:
    every = Lane("embedded", 4)
    named = Lane("remote", 4, frozenset({"gpt-4o"}))
    assert lane_of("gpt-4o", [every, named]) == "remote"
    assert lane_of("smollm2", [every, named]) == "embedded"
    assert lane_of("smollm2", [named]) == UNROUTED
    assert lane_of(None, [named, every]) == "embedded"
