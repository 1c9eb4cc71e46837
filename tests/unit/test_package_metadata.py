"""The package's metadata: one version, written once (app.__version__), and what pyproject
declares about the package (its description, typed, py.typed shipped)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib

import app

ROOT = Path(__file__).resolve().parents[2]
#: hatchling's default pattern for `[tool.hatch.version] path` (hatchling/version/source/regex.py).
HATCH_VERSION = re.compile(r"""(?i)^(__version__|VERSION) *= *(['"])v?(?P<version>.+?)\2""", re.M)


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_reads_the_version_from_app_init_and_writes_none_itself() -> None:
    data = pyproject()
    assert "version" not in data["project"]
    assert "version" in data["project"]["dynamic"]
    source = ROOT / data["tool"]["hatch"]["version"]["path"]
    assert source == ROOT / "app" / "__init__.py"
    found = [m.group("version") for m in HATCH_VERSION.finditer(source.read_text())]
    assert found == [app.__version__]


def test_the_version_pattern_finds_what_hatch_finds() -> None:
    """The pattern above on text that breaks the rule, so the test above can fail."""
    text = '"""Doc."""\n\nimport os\n\n__version__ = "1.2.3"\n'
    assert [m.group("version") for m in HATCH_VERSION.finditer(text)] == ["1.2.3"]
    assert HATCH_VERSION.search('__version__ = metadata.version("batchyard")') is None


def test_the_package_says_it_is_typed() -> None:
    data = pyproject()
    assert "Typing :: Typed" in data["project"]["classifiers"]
    assert (ROOT / "app" / "py.typed").is_file()
    assert "[tool.mypy]" in (ROOT / "pyproject.toml").read_text()


def test_the_description_names_the_four_apis_and_both_kinds_of_engine() -> None:
    """The one-line description in pyproject, the package docstring, and the README's first
    sentence say the same: no place still says only 'Files and Batch'."""
    texts = {
        "pyproject": pyproject()["project"]["description"],
        "app": app.__doc__ or "",
        "README": (ROOT / "README.md").read_text().split("\n\n")[1],
    }
    for where, text in texts.items():
        flat = " ".join(text.replace("*", "").split())
        assert "Files, Batch, Uploads and Responses APIs" in flat, where
        assert "llama.cpp" in flat and "upstream OpenAI-compatible servers" in flat, where
