"""Loading the engines: a llama.cpp build that cannot load is a load failure /health reports;
the lanes the registry gives the claims."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.batches.claims.claims import room
from app.config import Settings
from app.config.upstreams import UpstreamSpec
from app.engine.registry import EMBEDDED, EngineRegistry, load_engines
from app.engine.upstream.process import UpstreamProcess
from app.wire.endpoints import CHAT
from tests.fakes import FakeUpstream, HangingEngine


def test_a_build_that_cannot_load_is_a_failure_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As when llama_cpp cannot load its library (a CUDA build whose cuBLAS is gone): the
    # import of the engine raises. It used to escape the load thread, and /health said
    # "starting" for ever.
    monkeypatch.setitem(sys.modules, "app.engine.llama.loading", None)
    registry, failure = load_engines(Settings(data_dir=str(tmp_path)))
    assert registry is None
    assert failure is not None and failure.startswith("ModuleNotFoundError: ")


def test_an_upstreams_lane_is_four_times_its_slots_deep() -> None:
    """An upstream answers in milliseconds: its lane holds 4x its slots (claims.room), so
    its client's queue outlasts a runner step; the embedded engine's stays at 2x."""
    spec = UpstreamSpec(name="up", url="http://up.invalid/v1", models=("m",), concurrency=64)
    registry = EngineRegistry(HangingEngine(n_slots=4), [UpstreamProcess(spec)])
    by_name = {lane.name: lane for lane in registry.lanes()}
    assert (by_name["up"].depth, by_name[EMBEDDED].depth) == (4, 2)
    assert (room(by_name["up"], 10), room(by_name[EMBEDDED], 1)) == (246, 7)


def test_every_engines_names_are_read_by_the_catalogs_rule() -> None:
    """An upstream's names, configured or listed by its /v1/models, and a lone engine's
    id are read as other nodes read them once published (`app.catalog.lookup`): exactly
    first, `name` for `name:latest`, then letter case aside; the request reaches its engine
    as that engine's own spelling."""
    local = HangingEngine(n_slots=2)  # its model: "fake-model"
    listed = FakeUpstream("listed", ["gpt-4o", "llama3:latest"])
    spec = UpstreamSpec(name="configured", url="http://c.invalid/v1", models=("Qwen3-8B",))
    configured = UpstreamProcess(spec)
    registry = EngineRegistry(local, [configured, listed])
    cases = {
        "gpt-4o": (listed, "gpt-4o"),
        "GPT-4o": (listed, "gpt-4o"),
        "llama3": (listed, "llama3:latest"),
        "LLAMA3": (listed, "llama3:latest"),
        "qwen3-8b": (configured, "Qwen3-8B"),
        "fake-model": (local, "fake-model"),
        "Fake-Model": (local, "fake-model"),
    }
    for name, (engine, ident) in cases.items():
        found = registry.serving(name)
        assert found is not None and (found[0], found[1]) == (engine, ident), name
    assert registry.serving("gpt-4") is None and registry.serving("llama3:8b") is None
    # What a request names is what its engine is sent: the id it was resolved to.
    registry.submit(CHAT, {"model": "GPT-4o", "messages": [{"role": "user", "content": "x"}]})
    registry.submit(CHAT, {"model": "Fake-Model", "messages": [{"role": "user", "content": "y"}]})
    registry.submit(CHAT, {"model": "nobody", "messages": [{"role": "user", "content": "z"}]})
    assert [body["model"] for _, body, _ in listed.submitted] == ["gpt-4o"]
    assert [body["model"] for _, body, _ in local.submitted] == ["fake-model", "fake-model"]
    # The claims' lanes: each upstream its own names.
    lanes = {lane.name: lane.models for lane in registry.lanes()}
    assert lanes["listed"] == {"gpt-4o", "llama3:latest"}
    assert lanes["configured"] == {"Qwen3-8B"}
    # An upstream's list changes: the names follow.
    listed.served.append("Mistral")
    found = registry.serving("mistral")
    assert found is not None and found[1] == "Mistral"
