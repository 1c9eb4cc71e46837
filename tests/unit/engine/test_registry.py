"""Loading the engines: a llama.cpp build that cannot load is a load failure /health reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.config import Settings
from app.engine.registry import load_engines


def test_a_build_that_cannot_load_is_a_failure_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As when llama_cpp cannot load its library (a CUDA build whose cuBLAS is gone): the
    # import of the engine raises. It used to escape the load thread, and /health said
    # "starting" for ever.
    monkeypatch.setitem(sys.modules, "app.engine.llama.engine", None)
    registry, failure = load_engines(Settings(data_dir=str(tmp_path)))
    assert registry is None
    assert failure is not None and failure.startswith("ModuleNotFoundError: ")
