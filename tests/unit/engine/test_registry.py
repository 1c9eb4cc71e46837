"""Loading the engines: a llama.cpp build that cannot load is a load failure /health reports;
the lanes the registry gives the claims."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.batches.claims import room
from app.config import Settings
from app.config.upstreams import UpstreamSpec
from app.engine.registry import EMBEDDED, EngineRegistry, load_engines
from app.engine.upstream.process import UpstreamProcess
from tests.fakes import HangingEngine


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
