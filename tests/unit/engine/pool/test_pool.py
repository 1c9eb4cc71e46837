"""The model pool's bookkeeping over fake engines (one per loaded model, answering when the
test says): what fits, what fails, what a drained model still runs, loads side by side
where the budget holds them, and the figures it adds up. The same pool on real models:
test_model_pool.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from app.catalog import Entry, Estimate
from app.config import Settings, bundled_model_path
from app.engine.base import EngineError, EngineStats, Priority
from app.engine.pool.pool import ModelPool
from app.engine.registry import DEFAULT_ROUTE, EMBEDDED, EngineRegistry
from app.wire.endpoints import CHAT
from tests.catalogs import DictCatalog, entry
from tests.fakes import FakeLoads, HangingEngine, finish
from tests.waiting import until

MODEL_SETTINGS = dict(max_loaded_models=1, model_ttl="0", model_switch_after="1h")
MiB = 1 << 20


def body(model: str, content: str = "hi") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def three(**changes: object) -> tuple[Settings, DictCatalog]:
    """The default model "a", and "b" and "c": one file under three load profiles (three
    berths), 100 MiB each by their estimates."""
    settings = Settings(**{**MODEL_SETTINGS, **changes})
    estimate = Estimate(weights=100 * MiB, kv_cache=0, compute=0)
    entries = [
        replace(
            entry(id, bundled_model_path(), Settings(**MODEL_SETTINGS, ctx_size=256 * (i + 1))),
            estimate=estimate,
            is_default=i == 0,
        )
        for i, id in enumerate("abc")
    ]
    return settings, DictCatalog(entries)


def test_a_model_that_cannot_fit_alone_fails_its_requests_saying_why() -> None:
    settings = Settings(**MODEL_SETTINGS)
    path = bundled_model_path()
    big = entry("big", path, Settings(**MODEL_SETTINGS, ctx_size=1024))
    pool = ModelPool(
        settings,
        DictCatalog([entry("a", path, settings, default=True), big]),
        budget=big.size_bytes // 2,
        loader=FakeLoads(),
    )
    pool.start()
    try:
        with pytest.raises(EngineError) as failed:
            pool.submit(CHAT, body("big")).result(10)
        assert failed.value.code == "model_load_failed"
        assert "needs 0.09 GiB, the budget is 0.05 GiB (--models-memory)" in failed.value.message
        assert pool.submit(CHAT, body("a")).result(10)["model"] == "a"
        assert pool.stats().requests_total.get("failed") == 1
    finally:
        pool.close()


def test_a_line_claimed_as_its_model_drains_still_runs_on_it() -> None:
    """A line claimed just before its model stopped being fed goes to the engine still
    loaded (finishing the others), not to a later load; an online request waits."""
    settings = Settings(**MODEL_SETTINGS)
    path = bundled_model_path()
    other = Settings(**MODEL_SETTINGS, ctx_size=1024)
    loads = FakeLoads()
    catalog = DictCatalog([entry("a", path, settings, default=True), entry("b", path, other)])
    pool = ModelPool(settings, catalog, budget=1 << 40, loader=loads)
    pool.start()
    try:
        hang = body("a", "HANG")
        first = pool.submit(CHAT, hang, priority=Priority.BATCH)
        pool.demand({"b": (5, 0.0)})  # a's queue is empty: b's turn once a's line is done
        until(lambda: pool.active() == [], 10, "a to be drained")
        late = pool.submit(CHAT, hang, priority=Priority.BATCH)
        online = pool.submit(CHAT, body("a"))
        assert len(loads.engines[0].hanging) == 2 and not online.done()
        assert finish(loads.engines[0]) == 2
        assert first.result(5)["model"] == late.result(5)["model"] == "a"
        # Then b loads; the online request for a waits for a's next turn.
        until(lambda: loads.ids() == ["a", "b"], 10, "b to be loaded")
        assert not online.done()
        # Withdrawn while it waits: it fails as cancelled, and leaves its berth.
        pool.cancel(online)
        with pytest.raises(EngineError, match="cancelled"):
            online.result(1)
        assert {v.entry.id: v.waiting for v in pool.views()}["a"] == 0
    finally:
        pool.close()


def test_every_id_of_a_model_listed_twice_gets_its_lane() -> None:
    """One file under one profile listed under two ids (`ollama cp` copies a model under a
    new name, its blob the same) is one berth: the lines routed to either id are claimed
    by its lane, and the default model's second id rides with the default lane."""
    settings = Settings(**MODEL_SETTINGS)
    path = bundled_model_path()
    other = Settings(**MODEL_SETTINGS, ctx_size=1024)
    entries = [
        entry("a", path, settings, default=True),
        entry("a-copy", path, settings),
        entry("b", path, other),
        entry("b-copy", path, other),
    ]
    loads = FakeLoads()
    pool = ModelPool(settings, DictCatalog(entries), budget=1 << 40, loader=loads)
    pool.start()
    registry = EngineRegistry(pool, [], owns_embedded=False)
    try:
        assert lanes_of(registry) == {EMBEDDED: {"a", "a-copy", DEFAULT_ROUTE}}
        pool.demand({"b-copy": (3, 0.0)})  # lines routed to the second id only
        until(lambda: set(lanes_of(registry)) == {f"{EMBEDDED}:b-copy"}, 10, "b to be fed")
        assert list(lanes_of(registry).values()) == [{"b", "b-copy"}]
        assert [f.ids for f in pool.active()] == [("b-copy", "b")]  # the berth's id first
        # Either id runs on the one engine (one load for both), answered as the id it named.
        for model in ("b", "b-copy"):
            answer = pool.submit(CHAT, body(model), priority=Priority.BATCH).result(10)
            assert answer["model"] == model
        assert loads.ids() == ["a", "b-copy"]
    finally:
        pool.close()


def lanes_of(registry: EngineRegistry) -> dict[str, frozenset[str]]:
    return {lane.name: lane.models for lane in registry.lanes()}


def test_a_model_that_failed_to_load_is_tried_again_once_its_file_changed(
    tmp_path: Path,
) -> None:
    settings = Settings(**MODEL_SETTINGS)
    path = tmp_path / "late.gguf"
    path.write_bytes(b"GGUF cut short")
    loads = FakeLoads()

    def loader(s: Settings, e: Entry) -> HangingEngine:
        if e.path.read_bytes().startswith(b"GGUF cut"):
            raise RuntimeError(f"llama.cpp could not load {e.path}")
        return loads(s, e)

    default = entry("a", bundled_model_path(), settings, default=True)
    catalog = DictCatalog([default, entry("late", path, settings)])
    pool = ModelPool(settings, catalog, budget=1 << 40, loader=loader)
    pool.start()
    try:
        with pytest.raises(EngineError, match="could not load"):
            pool.submit(CHAT, body("late")).result(10)
        # The download finishes: the catalog lists the file with its new size.
        path.write_bytes(b"GGUF, whole this time")
        catalog.put(entry("late", path, settings))
        assert pool.submit(CHAT, body("late")).result(10)["model"] == "late"
        assert loads.ids() == ["a", "late"]
    finally:
        pool.close()


class GatedLoads(FakeLoads):
    """Loads that each wait at a gate until the test opens it, counting how many wait
    there at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def __call__(self, settings: object, e: Entry) -> HangingEngine:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        if e.id != "a":  # the default loads at start, before the test
            assert self.gate.wait(10)
        with self.lock:
            self.inside -= 1
            engine = super().__call__(settings, e)
        # What each load took, as a real engine says it (each its own: b 120 MiB, c 180).
        engine.measured_bytes = {"a": 100, "b": 120, "c": 180}[e.id] * MiB
        return engine


def test_where_the_budget_holds_them_all_models_load_side_by_side() -> None:
    settings, catalog = three(max_loaded_models=3)
    loads = GatedLoads()
    pool = ModelPool(settings, catalog, budget=1 << 30, loader=loads)
    pool.start()
    try:
        answers = [pool.submit(CHAT, body("b"))]
        until(lambda: loads.inside == 1, 10, "b to load")
        # c is asked for while b loads: it fits beside them all, so it does not wait.
        answers.append(pool.submit(CHAT, body("c")))
        until(lambda: loads.inside == 2, 10, "c to load beside b")
        assert {v.entry.id: v.state for v in pool.views()} == {
            "a": "idle",
            "b": "loading",
            "c": "loading",
        }
        loads.gate.set()
        assert [f.result(10)["model"] for f in answers] == ["b", "c"]
        assert loads.most == 2
        # Each measured alone, as its engine says (not shared out by estimate: 150 each).
        views = {v.entry.id: v for v in pool.views()}
        assert (views["b"].measured_bytes, views["c"].measured_bytes) == (120 * MiB, 180 * MiB)
        assert pool.budget() == (400 * MiB, 1 << 30)
        assert views["b"].loads == views["c"].loads == 1
    finally:
        pool.close()


def test_where_the_budget_is_short_models_load_one_at_a_time() -> None:
    # Room for a and one more: b and c wait for each other's turn.
    settings, catalog = three(max_loaded_models=0)
    loads = GatedLoads()
    pool = ModelPool(settings, catalog, budget=250 * MiB, loader=loads)
    pool.start()
    try:
        loads.gate.set()
        answers = [pool.submit(CHAT, body(m)) for m in "bc"]
        assert [f.result(10)["model"] for f in answers] == ["b", "c"]
        assert loads.most == 1 and loads.ids() == ["a", "b", "c"]
    finally:
        pool.close()


class Encoding(HangingEngine):
    """A fake engine whose projector encoded 3 images."""

    def stats(self) -> EngineStats:
        return EngineStats(images_encoded=3, prompt_tokens_total=10)


def test_the_pools_figures_add_its_engines_up_and_keep_those_of_engines_closed() -> None:
    settings, catalog = three()
    pool = ModelPool(settings, catalog, budget=1 << 30, loader=lambda s, e: Encoding())
    pool.start()
    try:
        assert pool.stats().images_encoded == 3
        pool.unload("a")
        until(lambda: pool.views()[0].state == "on disk", 10, "a to be unloaded")
        stats = pool.stats()
        assert (stats.images_encoded, stats.prompt_tokens_total) == (3, 10)
    finally:
        pool.close()
