"""The checks a commit meets: `.pre-commit-config.yaml` runs exactly the checks tests/run.sh
runs before pytest, in the same order, so a commit that passes its hooks passes them in CI;
and mypy's strict rooms are rooms that exist."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_sh_checks(text: str) -> list[str]:
    """The commands after the installs and before pytest, with the venv written as `.venv`."""
    after_install = text[text.rindex("'.[test]'") :]  # the last install: the package
    lines = [
        re.sub(r'"\$VENV/bin/([\w-]+)"', r".venv/bin/\1", line.strip())
        for line in after_install.splitlines()[1:]
    ]
    return [ln for ln in lines if ln.startswith(".venv/bin/") and " -m pytest" not in ln]


def hook_checks(config: dict[str, object]) -> list[str]:
    repos = config["repos"]
    assert isinstance(repos, list)
    return [hook["entry"] for repo in repos for hook in repo["hooks"]]


def test_pre_commit_runs_what_tests_run_sh_checks() -> None:
    checks = run_sh_checks((ROOT / "tests" / "run.sh").read_text())
    assert len(checks) == 4  # ruff check, ruff format --check, lint-imports, mypy
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert hook_checks(config) == checks


def test_a_check_missing_from_the_hooks_is_seen() -> None:
    """The comparison above on a run.sh with one more check, so it can fail."""
    text = (ROOT / "tests" / "run.sh").read_text()
    more = text.replace(
        '"$VENV/bin/python" -m mypy', '"$VENV/bin/python" -m mypy\n"$VENV/bin/codespell"'
    )
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert run_sh_checks(more)[-1] == ".venv/bin/codespell"
    assert hook_checks(config) != run_sh_checks(more)


def test_the_rooms_mypy_checks_strictly_exist() -> None:
    """A renamed room would silently leave the strict list (mypy only warns about an
    override that matches nothing), so each entry must name a module or package in app/."""
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs")]
    assert len(strict) == 1
    modules = strict[0]["module"]
    assert modules
    for name in modules:
        path = ROOT / Path(*name.removesuffix(".*").split("."))
        wanted = path.is_dir() if name.endswith(".*") else path.with_suffix(".py").is_file()
        assert wanted, name
