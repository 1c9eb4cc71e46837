"""The test tree's own layout: tests/unit/ mirrors app/'s folders, every test folder is a
package, and no two test files share a name (a failure names its file, and `pytest -k` or a
search for the file then finds one)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
NOT_TESTS = {"__pycache__", "data"}  # bytecode, and the inputs tests read
UNIT_ONLY = {"helpers"}  # a folder of shared helpers under tests/unit/ mirrors nothing


def folders(top: Path) -> list[Path]:
    """The folders under `top` that hold Python (not caches, data, or a run's leftovers)."""
    return sorted(
        p
        for p in top.rglob("*")
        if p.is_dir()
        and not any(part in NOT_TESTS or part.startswith(".") for part in p.relative_to(top).parts)
        and any(p.rglob("*.py"))
    )


def shared_names(top: Path) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for f in sorted(top.rglob("test_*.py")):
        by_name[f.name].append(str(f.relative_to(top)))
    return {name: paths for name, paths in sorted(by_name.items()) if len(paths) > 1}


def unmirrored(unit: Path, app: Path) -> list[str]:
    return [
        str(d.relative_to(unit))
        for d in folders(unit)
        if not (app / d.relative_to(unit)).is_dir()
        and d.relative_to(unit).parts[0] not in UNIT_ONLY
    ]


def not_packages(top: Path) -> list[str]:
    return [str(d.relative_to(top)) for d in folders(top) if not (d / "__init__.py").is_file()]


def test_no_two_test_files_share_a_name() -> None:
    assert shared_names(TESTS) == {}


def test_every_folder_under_tests_unit_has_its_folder_under_app() -> None:
    assert unmirrored(TESTS / "unit", ROOT / "app") == []


def test_every_test_folder_is_a_package() -> None:
    assert not_packages(TESTS) == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The three checks above on a made-up tree that breaks each rule, so they can fail."""
    (tmp_path / "app" / "batches").mkdir(parents=True)
    unit = tmp_path / "tests" / "unit"
    (unit / "batches").mkdir(parents=True)
    (unit / "billing").mkdir()
    (unit / "helpers").mkdir()
    for d in ("batches", "billing", "helpers"):
        (unit / d / "conftest.py").touch()
    assert unmirrored(unit, tmp_path / "app") == ["billing"]
    (unit / "test_runner.py").touch()
    (unit / "batches" / "test_runner.py").touch()
    (unit / "test_claims.py").touch()
    assert shared_names(unit) == {"test_runner.py": ["batches/test_runner.py", "test_runner.py"]}
    (unit / "helpers" / "__init__.py").touch()
    assert not_packages(unit) == ["batches", "billing"]
