"""Fixtures of the catalog's tests: a temporary HOME with no stores, settings on a data dir
of their own, and a Catalog that looks at its stores at every call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.catalog import Catalog
from app.catalog import catalog as catalog_module
from tests.stores import Home


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def make_catalog(
    home: Home, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Catalog]:
    """Catalog(Settings(data_dir=..., **flags)) over `home`; stores are looked at on every
    call (the 2 s recheck interval has a test of its own)."""
    monkeypatch.setattr(catalog_module, "RECHECK_SECONDS", 0.0)

    def make(**flags: Any) -> Catalog:
        return home.catalog(data_dir, **flags)

    return make
