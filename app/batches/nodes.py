"""The nodes on one database and the model names each serves.

Several nodes on one PostgreSQL may hold different models. Each publishes the names its
catalog resolves (a `NodeModel` row each, with the id of the model the name means there)
at start and again whenever its catalog changes, and renews the lease on its `Node` row
every third of --lease-seconds, as its runner renews its lines' leases. Its names count
for the other nodes until that lease runs out: a node killed stops counting a lease later,
one stopped cleanly withdraws at once, and the next node to publish deletes the rows of
nodes whose lease ran out. A node found gone by its own renewal (a pause past its lease, or
another node deleted it) publishes again.

Validation asks `NodeNames.read_elsewhere()`: the names other live nodes serve, each with
the id of its model there (`names_elsewhere(session, node_id)`), so that a batch naming a
model only another node holds is routed to that model's id and waits for that node.
`unserved_lines` counts the lines whose model no live node serves now: they wait for one
to come (back), or for their batch's window to end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from sqlalchemy import delete, func, insert, update
from sqlmodel import Session, col, select

from app.batches.lifecycle.validate import ModelRules
from app.catalog import DEFAULT_ROUTE, Entry
from app.config import Settings
from app.db import Database
from app.engine.base import Engine
from app.engine.node import ModelDirectory
from app.tables import Batch, BatchStatus, Node, NodeModel, Request, RequestStatus, now

log = logging.getLogger("batchyard.nodes")

#: Seconds between two looks at the catalog for a change (it reads its stores again at most
#: every ~2 s itself).
CATALOG_LOOK = 2.0


def names_elsewhere(s: Session, node_id: str, *, at: float | None = None) -> dict[str, str]:
    """Every model name another node serves whose lease holds (at `at`, default now), with
    the id of the model it means there: one query over two small tables (a row a node, a
    row a name). Where two nodes differ on a name's id, the lowest id wins, on every node."""
    t = time.time() if at is None else at
    rows = s.exec(
        select(NodeModel.name, NodeModel.model_id)
        .join(Node, col(Node.id) == col(NodeModel.node_id))
        .where(col(Node.id) != node_id, col(Node.lease_until) > t)
        .order_by(col(NodeModel.name), col(NodeModel.model_id))
    ).all()
    names: dict[str, str] = {}
    for name, model_id in rows:
        names.setdefault(name, model_id)
    return names


def unserved_lines(
    s: Session, *, batch_id: str | None = None, at: float | None = None
) -> dict[str, dict[str, int]]:
    """The pending lines of batches in progress (or of `batch_id` alone) whose route no live
    node serves (none publishes that model id): batch id -> {route: lines}. They are never
    given to another model; they wait for a node that holds theirs, or for their batch's
    window to end."""
    t = time.time() if at is None else at
    served = (
        select(NodeModel.model_id)
        .join(Node, col(Node.id) == col(NodeModel.node_id))
        .where(col(Node.lease_until) > t)
    )
    rows = s.exec(
        select(Batch.id, Batch.route, func.count(col(Request.id)))
        .join(Request, col(Request.batch_id) == col(Batch.id))
        .where(
            col(Batch.status) == BatchStatus.IN_PROGRESS,
            col(Batch.route).is_not(None),
            col(Batch.route) != DEFAULT_ROUTE,
            col(Batch.route).not_in(served),
            col(Request.status) == RequestStatus.PENDING,
            *([col(Batch.id) == batch_id] if batch_id is not None else []),
        )
        .group_by(col(Batch.id), col(Batch.route))
    ).all()
    out: dict[str, dict[str, int]] = {}
    for row_batch, route, n in rows:
        out.setdefault(row_batch, {})[str(route)] = int(n)
    return out


def served_names(entries: Iterable[Entry], budget: int) -> dict[str, str]:
    """What a node publishes: each name of each catalog entry -> that entry's id, but for
    models whose estimate alone exceeds the node's memory `budget` (bytes): it could never
    load them, so their lines are left to a node that can."""
    names: dict[str, str] = {}
    for entry in entries:
        if entry.estimate is not None and entry.estimate.total > budget:
            continue
        for name in sorted(entry.names | {entry.id}):
            names.setdefault(name, entry.id)
    return names


def node_models(
    settings: Settings, db: Database, node_id: str, engine: Engine
) -> tuple[NodeNames, ModelRules]:
    """This node's published names and its validation's model rules, over the models its
    engines serve (`app.engine.node.ModelDirectory`: its catalog, memory budget and
    upstreams)."""
    models = ModelDirectory(engine, settings)

    def served() -> dict[str, str]:
        # In the order this node's own engines take a name two give (`EngineRegistry.names`):
        # an upstream's configured names, then the catalog's, then the upstreams' listed ones.
        names = {name: name for name in models.configured()}
        for name, ident in served_names(models.catalog.entries(), models.budget()).items():
            names.setdefault(name, ident)
        for name in sorted(models.listed()):
            names.setdefault(name, name)
        return names

    nodes = NodeNames(db, node_id, served, lease_seconds=settings.lease_seconds)
    rules = ModelRules(
        models.catalog,
        elsewhere=nodes.read_elsewhere,
        budget=models.budget,
        strict=settings.strict_models,
        serving=models.serving,
        pooled=models.pooled,
    )
    return nodes, rules


class NodeNames:
    """This node's rows: its `Node` lease and the names it serves (`names()`: name -> model
    id, read again every CATALOG_LOOK seconds).

    `beat()` is called on every step of the runner's thread and keeps its own pace: it
    publishes when the names changed (or were never published) and renews the lease every
    third of `lease_seconds`. `withdraw()` deletes this node's rows on a clean stop.
    """

    def __init__(
        self,
        db: Database,
        node_id: str,
        names: Callable[[], Mapping[str, str]],
        *,
        lease_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.node_id = node_id
        self.lease_seconds = lease_seconds
        self._names = names
        self._clock = clock
        #: What the database holds of this node: its names, and when its lease was renewed.
        self.published: dict[str, str] | None = None
        self._renewed = 0.0
        self._looked = float("-inf")

    def read_elsewhere(self) -> dict[str, str]:
        """The names other live nodes serve (name -> model id there), read now: what
        validation asks, once a batch, so that a node that published a moment ago counts."""
        with self.db.read() as s:
            return names_elsewhere(s, self.node_id, at=self._clock())

    def beat(self) -> None:
        t = self._clock()
        if self.published is None or t - self._looked >= CATALOG_LOOK:
            self._looked = t
            names = dict(self._names())
            if names != self.published:
                self.publish(names, t)
                return
        if t - self._renewed >= self.lease_seconds / 3:
            self._renew(t)

    def publish(self, names: Mapping[str, str], t: float) -> None:
        """Replace this node's names with `names` and renew its lease, in one transaction;
        delete the nodes whose lease ran out."""
        with self.db.write() as s:
            if not self._renew_lease(s, t):
                s.add(Node(id=self.node_id, started_at=now(), lease_until=t + self.lease_seconds))
                s.flush()
            conn = s.connection()
            conn.execute(delete(NodeModel).where(col(NodeModel.node_id) == self.node_id))
            if names:
                conn.execute(
                    insert(NodeModel),
                    [
                        {"node_id": self.node_id, "name": name, "model_id": model_id}
                        for name, model_id in sorted(names.items())
                    ],
                )
            # Rows locked by another node's publish are left to it (SKIP LOCKED): two nodes
            # deleting the same lapsed nodes in different orders would deadlock.
            gone = s.exec(
                select(Node.id)
                .where(col(Node.lease_until) < t, col(Node.id) != self.node_id)
                .order_by(col(Node.id))
                .with_for_update(skip_locked=True)
            ).all()
            if gone:
                conn.execute(delete(NodeModel).where(col(NodeModel.node_id).in_(gone)))
                conn.execute(delete(Node).where(col(Node.id).in_(gone)))
        self.published = dict(names)
        self._renewed = t
        log.info("node=%s published models=%d lapsed_nodes=%d", self.node_id, len(names), len(gone))

    def _renew_lease(self, s: Session, t: float) -> bool:
        """Renew this node's lease to t + lease_seconds; False when it has no row."""
        renewed = s.connection().execute(
            update(Node)
            .where(col(Node.id) == self.node_id)
            .values(lease_until=t + self.lease_seconds)
        )
        return bool(renewed.rowcount)

    def _renew(self, t: float) -> None:
        with self.db.write() as s:
            found = self._renew_lease(s, t)
        self._renewed = t
        if not found:
            # Deleted as lapsed by another node (this one paused past its lease): publish
            # again, so the names count once more.
            log.warning("node=%s lease had lapsed: publishing its models again", self.node_id)
            self.publish(self.published or {}, t)

    def withdraw(self) -> None:
        """Delete this node's rows (a clean stop): its names stop counting at once."""
        with self.db.write() as s:
            conn = s.connection()
            conn.execute(delete(NodeModel).where(col(NodeModel.node_id) == self.node_id))
            conn.execute(delete(Node).where(col(Node.id) == self.node_id))
        self.published = None


__all__ = [
    "CATALOG_LOOK",
    "NodeNames",
    "names_elsewhere",
    "node_models",
    "served_names",
    "unserved_lines",
]
