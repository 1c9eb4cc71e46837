"""The wheel carries the templates, the static files and the vendored JS, and a fresh
install (pip into a new venv, or pipx) serves the dashboard from outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.packaging.helpers import (
    check_dashboard,
    clean_copy,
    files_under,
    outside_env,
    start,
    static_files,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return clean_copy(tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(source), "-w", str(out)],
        check=True,
        env=outside_env(),
        timeout=300,
    )
    (found,) = out.glob("batchyard-*.whl")
    return found


def test_wheel_contains_templates_static_files_and_vendored_js(wheel: Path, source: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = files_under(source / "templates")
    static = files_under(source / "static")
    assert templates and static
    assert {f"app/templates/{t}" for t in templates} <= names
    assert {f"app/static/{s}" for s in static} <= names
    if (source / "static" / "vendor").is_dir():
        vendored = [
            n for n in names if n.startswith("app/static/vendor/htmx") and n.endswith(".js")
        ]
        assert vendored, sorted(n for n in names if "static" in n)
    assert "app/cli.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "batchyard = app.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert not any(n.startswith(("tests/", "app/tests/")) for n in names)


def test_pip_install_into_a_fresh_venv_serves_the_dashboard(
    wheel: Path, source: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # llama-cpp-python comes from pip's wheel cache (built once by tests/run.sh's install).
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        env=outside_env(),
        timeout=600,
    )
    away = tmp_path / "elsewhere"
    away.mkdir()
    server = start([str(venv / "bin/batchyard")], away, tmp_path / "serve.log")
    try:
        check_dashboard(server.url, static_files(source))
    finally:
        server.stop()
    # It ran the installed package, not the checkout.
    assert (away / "batchyard-data" / "batchyard.db").is_file()


def test_pipx_install_of_the_checkout_serves_the_dashboard(source: Path, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
    subprocess.run(
        [str(tools / "bin/python"), "-m", "pip", "install", "-q", "pipx"],
        check=True,
        env=outside_env(),
        timeout=300,
    )
    pipx_env = {
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "bin"),
        "PIPX_MAN_DIR": str(tmp_path / "man"),
    }
    # The README's command, run in the clean clone: `pipx install .`
    subprocess.run(
        [str(tools / "bin/pipx"), "install", "."],
        cwd=source,
        check=True,
        env=outside_env(**pipx_env),
        timeout=600,
        capture_output=True,
    )
    exe = tmp_path / "bin" / "batchyard"
    assert exe.exists()
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("batchyard ")
    away = tmp_path / "elsewhere"
    away.mkdir()
    server = start([str(exe)], away, tmp_path / "serve.log")
    try:
        check_dashboard(server.url, static_files(source))
    finally:
        server.stop()
