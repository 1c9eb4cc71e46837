"""The model names each node publishes on the shared database, and which still count.

Two publishers (two nodes' `NodeNames`) on one real database, SQLite and PostgreSQL, with a
clock the test moves: published at the first beat, again when the catalog changes, counted
while the lease holds, withdrawn at a clean stop, published again after a lapse.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import delete, select

from app.batches.nodes import (
    CATALOG_LOOK,
    NodeNames,
    names_elsewhere,
    node_models,
    served_names,
)
from app.catalog import Entry, Estimate, LoadProfile
from app.config import Settings
from app.config.upstreams import UpstreamSpec
from app.db import Database
from app.engine.registry import EngineRegistry
from app.engine.upstream.process import UpstreamProcess
from app.services import build_services
from app.tables import BatchStatus, Node, NodeModel
from tests import pg
from tests.factories import batch_line
from tests.fakes import FakeEngine, HangingEngine
from tests.models import header_model
from tests.unit.helpers import batch, make_batch

LEASE = 30.0
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def migrated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    """One migrated database of each kind for the module (a migration costs a second)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('nodes') / 'batchyard.db'}"
        database = Database(url)
        database.migrate()
        yield database
        database.close()
        return
    with pg.fresh_schema(request.getfixturevalue("postgres_database")) as url:
        database = Database(url)
        database.migrate()
        yield database
        database.close()


@pytest.fixture
def db(migrated: Database) -> Database:
    """The module's database with no node in it."""
    with migrated.write() as s:
        s.exec(delete(NodeModel))
        s.exec(delete(Node))
    return migrated


def elsewhere(db: Database, node_id: str, at: float) -> set[str]:
    with db.read() as s:
        return set(names_elsewhere(s, node_id, at=at))


def node(db: Database, node_id: str, names: dict[str, str], clock: Clock) -> NodeNames:
    return NodeNames(db, node_id, lambda: names, lease_seconds=LEASE, clock=clock)


def test_each_node_sees_the_names_the_others_serve(db: Database) -> None:
    clock = Clock()
    a = node(db, "a", {"gemma3:270m": "gemma3:270m", "gemma3": "gemma3:270m"}, clock)
    b = node(db, "b", {"smol": "smol", "gemma3:270m": "gemma3:270m"}, clock)
    assert elsewhere(db, "a", T0) == set()
    a.beat()
    b.beat()
    assert elsewhere(db, "a", T0) == {"smol", "gemma3:270m"}
    assert elsewhere(db, "b", T0) == {"gemma3", "gemma3:270m"}
    assert elsewhere(db, "c", T0) == {"smol", "gemma3", "gemma3:270m"}
    with db.read() as s:
        rows = s.exec(select(NodeModel.name, NodeModel.model_id).where(NodeModel.node_id == "a"))
        assert sorted(rows.all()) == [("gemma3", "gemma3:270m"), ("gemma3:270m", "gemma3:270m")]


def test_validation_reads_each_name_with_the_id_it_means_on_the_other_node(db: Database) -> None:
    clock = Clock()
    a = node(db, "a", {"smol": "smol"}, clock)
    b = node(db, "b", {"gemma3:270m": "gemma3:270m", "gemma3": "gemma3:270m"}, clock)
    a.beat()
    assert a.read_elsewhere() == {}  # b has not published yet
    b.beat()
    assert b.read_elsewhere() == {"smol": "smol"}
    assert a.read_elsewhere() == {"gemma3:270m": "gemma3:270m", "gemma3": "gemma3:270m"}


def test_a_catalog_change_is_published_at_the_next_look(db: Database) -> None:
    clock = Clock()
    names = {"smol": "smol"}
    a = NodeNames(db, "a", lambda: names, lease_seconds=LEASE, clock=clock)
    a.beat()
    names = {"smol": "smol", "qwen": "qwen"}  # a model dropped into --models-dir
    clock.t += CATALOG_LOOK / 2
    a.beat()
    assert elsewhere(db, "b", clock.t) == {"smol"}  # not looked at yet
    clock.t += CATALOG_LOOK / 2
    a.beat()
    assert elsewhere(db, "b", clock.t) == {"smol", "qwen"}
    names = {}
    clock.t += CATALOG_LOOK
    a.beat()
    assert elsewhere(db, "b", clock.t) == set()


def test_names_stop_counting_when_the_lease_runs_out(db: Database) -> None:
    clock = Clock()
    a = node(db, "a", {"gemma3:270m": "gemma3:270m"}, clock)
    b = node(db, "b", {"smol": "smol"}, clock)
    a.beat()
    b.beat()
    # b renews every third of the lease; a stopped dead (no beat) after its first.
    for _ in range(4):
        clock.t += LEASE / 3
        b.beat()
        lapsed = clock.t >= T0 + LEASE
        assert elsewhere(db, "b", clock.t) == (frozenset() if lapsed else {"gemma3:270m"})
    assert elsewhere(db, "a", clock.t) == {"smol"}  # b's lease held all along
    # b's next publish deletes a, whose lease ran out.
    b.publish({"smol": "smol"}, clock.t)
    with db.read() as s:
        assert s.exec(select(Node.id)).all() == ["b"]
        assert s.exec(select(NodeModel.node_id).distinct()).all() == ["b"]
    # a wakes up (a pause, not a death): its renewal finds it gone and publishes again.
    a._renewed = float("-inf")
    a.beat()
    assert elsewhere(db, "b", clock.t) == {"gemma3:270m"}


def test_a_clean_stop_withdraws_the_names_at_once(db: Database) -> None:
    clock = Clock()
    a = node(db, "a", {"gemma3:270m": "gemma3:270m"}, clock)
    a.beat()
    assert elsewhere(db, "b", T0) == {"gemma3:270m"}
    a.withdraw()
    assert elsewhere(db, "b", T0) == set()
    with db.read() as s:
        assert s.exec(select(Node)).all() == []


def entry(model_id: str, names: set[str], total_gib: float | None) -> Entry:
    estimate = None if total_gib is None else Estimate(int(total_gib * 2**30), 0, 0)
    return Entry(
        id=model_id,
        names=frozenset(names),
        source="models-dir",
        path=Path(f"/models/{model_id}.gguf"),
        size_bytes=1,
        mtime=0.0,
        quantization="Q4_K_M",
        profile=LoadProfile(ctx_size=2048, parallel=0, n_gpu_layers=0, kv_cache_type="q8_0"),
        estimate=estimate,
    )


def test_a_node_serves_every_name_of_the_models_that_fit_its_budget() -> None:
    entries = [
        entry("smol", {"smol", "gpt-4o-mini"}, 0.3),
        entry("big", {"big", "big:latest"}, 40.0),
        entry("broken", {"broken"}, None),  # its header could not be read: it fails its lines
    ]
    assert served_names(entries, 8 * 2**30) == {
        "smol": "smol",
        "gpt-4o-mini": "smol",
        "broken": "broken",
    }


def test_two_nodes_services_publish_and_validate_by_each_others_models(
    tmp_path: Path, postgres_url: str
) -> None:
    """The services' wiring: each node's runner publishes its catalog at its first step,
    and validation on one node knows the other's models (--strict-models)."""
    nodes = []
    for name in ("a", "b"):
        models = tmp_path / f"models-{name}"
        header_model(models / f"only-{name}.gguf")
        settings = Settings(
            data_dir=str(tmp_path / "shared"),
            database_url=postgres_url,
            node_name=name,
            models_dir=[str(models)],
            no_discover=True,
            strict_models=True,
        )
        nodes.append(build_services(settings, FakeEngine()))
    a, b = nodes
    try:
        for svc in (a, b):
            svc.runner.step()
        assert a.runner.nodes is not None and b.runner.nodes is not None
        there = a.runner.nodes.read_elsewhere()
        assert there["only-b"] == "only-b" and "only-a" not in there
        # Both know the embedded default: its name is served by the other node too.
        assert "SmolLM2-135M-Instruct.Q4_1" in there
        made = {
            model: make_batch(a, [batch_line("c0", "hi", model=model)])
            for model in ("only-a", "only-b", "nowhere")
        }
        for _ in range(3):
            a.runner.step()
        assert batch(a, made["only-a"]).status != BatchStatus.FAILED
        assert batch(a, made["only-b"]).status != BatchStatus.FAILED
        # Each routed to its model's id, whichever node holds it.
        assert batch(a, made["only-a"]).route == "only-a"
        assert batch(a, made["only-b"]).route == "only-b"
        failed = batch(a, made["nowhere"])
        assert failed.status == BatchStatus.FAILED
        assert [e["code"] for e in json.loads(failed.errors_json or "[]")] == ["model_not_found"]
    finally:
        for svc in nodes:
            svc.runner.stop()
            svc.db.close()


def test_a_name_means_on_other_nodes_what_it_means_on_its_own(db: Database, tmp_path: Path) -> None:
    """A name both an upstream's `models=` and a catalog alias: this node sends it to the
    upstream, so it publishes it as the upstream's, and another node routes it there too."""
    models = tmp_path / "models"
    header_model(models / "tiny.gguf")
    config = tmp_path / "models.toml"
    config.write_text('[aliases]\ngpt-4o-mini = "tiny"\n')
    settings = Settings(
        data_dir=str(tmp_path / "data"),
        models_dir=[str(models)],
        models_config=str(config),
        no_discover=True,
    )
    spec = UpstreamSpec(name="up", url="http://up.invalid/v1", models=("gpt-4o-mini",))
    registry = EngineRegistry(HangingEngine(), [UpstreamProcess(spec)])
    names, _ = node_models(settings, db, "a", registry)
    names.beat()
    here = registry.serving("gpt-4o-mini")
    assert here is not None and here[1] == "gpt-4o-mini"
    with db.read() as s:
        there = names_elsewhere(s, "b")
    assert there["gpt-4o-mini"] == "gpt-4o-mini"
    assert there["tiny"] == "tiny"
