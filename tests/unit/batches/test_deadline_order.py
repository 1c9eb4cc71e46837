"""The earliest-deadline and fair-share order, written twice: as SQL in the claims
(claims._claim_query: owners take turns, within an owner the nearest deadline first and
batches of one deadline take turns) and played in Python by the projection
(projection.play). Both are played here on the same generated queues, on SQLite and on
PostgreSQL: each batch's last line comes where the play finishes it, give or take one
turn of each other batch (the claims take turns line by line, the play shares a rate)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, insert
from sqlmodel import SQLModel

from app.batches.claims.claims import _claim_query
from app.batches.claims.projection import play
from app.tables import Batch, BatchStatus, Request, RequestStatus

#: A queue: batches in the order they were made, each (owner, lines, deadline).
QUEUES = st.lists(
    st.tuples(
        st.sampled_from(["ann", "bob", "cy"]),
        st.integers(1, 20),
        st.sampled_from([None, 3_600, 7_200]),
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest) -> Iterator[Engine]:
    url = "sqlite://" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    engine = create_engine(url)
    SQLModel.metadata.create_all(engine, tables=[Batch.__table__, Request.__table__])  # type: ignore[attr-defined]
    yield engine
    engine.dispose()


def claim_order(db: Engine, queue: list[tuple[str, int, int | None]]) -> list[str]:
    """The batch of each line, in the order one claim of every line takes them."""
    batches: list[dict[str, Any]] = []
    lines: list[dict[str, Any]] = []
    for i, (owner, n, deadline) in enumerate(queue):
        batch_id = f"batch_{i}"
        batches.append({
            "id": batch_id, "owner": owner, "endpoint": "/v1/chat/completions",
            "input_file_id": "file-1", "status": BatchStatus.IN_PROGRESS, "route": "",
            "created_ns": i, "expires_at": deadline, "total": n,
        })  # fmt: skip
        lines += [
            {"id": f"{batch_id}-{k}", "batch_id": batch_id, "line": k, "custom_id": str(k),
             "offset": 0, "length": 0, "status": RequestStatus.PENDING}
            for k in range(1, n + 1)
        ]  # fmt: skip
    with db.begin() as c:
        c.execute(Request.__table__.delete())  # type: ignore[attr-defined]
        c.execute(Batch.__table__.delete())  # type: ignore[attr-defined]
        c.execute(insert(Batch.__table__), batches)  # type: ignore[attr-defined]
        c.execute(insert(Request.__table__), lines)  # type: ignore[attr-defined]
        rows = c.execute(_claim_query(None), {"look": 1_000, "lapsed": 0.0, "wanted": 1_000})
        return [row.batch_id for row in rows]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(queue=QUEUES)
def test_the_claims_and_the_projection_finish_batches_in_one_order(
    db: Engine, queue: list[tuple[str, int, int | None]]
) -> None:
    order = claim_order(db, queue)
    assert len(order) == sum(n for _, n, _ in queue)
    # Where each batch's last line comes in the claims' order, and when the projection's
    # play (one line a second, shared as the claims share it) finishes it. The claims take
    # turns line by line where the play shares the rate, so a batch's last line may come
    # sooner or later by up to one round of the turns it shares: one line of each owner,
    # times the batches of its owner that share its deadline; and never further.
    last = {b: i + 1 for i, b in enumerate(order)}
    played = play({f"batch_{i}": item for i, item in enumerate(queue)}, 1.0)
    owners = len({owner for owner, _, _ in queue})
    for b, (t, ahead) in played.items():
        owner, lines, deadline = queue[int(b.removeprefix("batch_"))]
        group = sum(1 for o, _, d in queue if (o, d) == (owner, deadline))
        round_ = owners * group
        assert abs(last[b] - t) <= round_ - 1 + 1e-6, (b, queue, order, played)
        assert abs((last[b] - lines) - ahead) <= round_, (b, queue, order, played)
