"""Packaging fixtures: a clean copy of the checkout, and the sound llama-cpp-python wheel;
and the slow installs started as the session starts (early.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import ROOT
from tests.packaging import early
from tests.packaging.helpers import clean_copy


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.collectonly:
        return
    names = {item.path.name for item in items}
    if "test_binary.py" in names:
        early.start("binary")
    if "test_engine_build_in_throwaway_venv.py" in names:
        early.start("engine-venv")
    if "test_wheel.py" in names:
        early.start("pip")
        early.start("pipx")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    early.stop()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return clean_copy(tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """packaging/llama_wheel.sh's wheelhouse: tests/run.sh built the wheel there before the
    tests, so this only finds it (and builds it, once, where pytest runs on its own)."""
    found = subprocess.run(
        ["bash", "packaging/llama_wheel.sh", sys.executable],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=1800,
    )
    return Path(found.stdout.strip())
