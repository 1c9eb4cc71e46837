"""The wheel carries the templates, the static files and the vendored JS, and a fresh
install (pip into a new venv, or pipx) serves the dashboard from outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import app
from tests.packaging.helpers import (
    assert_cpu_check_passed,
    assert_llama_cpp_from,
    check_dashboard,
    files_under,
    outside_env,
    start,
    static_files,
)

pytestmark = pytest.mark.slow


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
    assert "app/cli/__init__.py" in names
    assert "app/toolchain/amx_tilecfg.h" in names  # `batchyard engine build` compiles with it
    # Alembic finds its revisions as files next to env.py (Database.migrate at start-up).
    migrations = files_under(source / "app" / "migrations")
    assert {f"app/migrations/{m}" for m in migrations if "__pycache__" not in m} <= names
    assert "app/migrations/versions/0001_tables_of_0_1_0.py" in names
    assert "app/py.typed" in names  # the package says it is typed (PEP 561)
    # The version written once, in app/__init__.py, is the wheel's.
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    lines = zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
    assert f"Version: {app.__version__}" in lines
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "batchyard = app.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert not any(n.startswith(("tests/", "app/tests/")) for n in names)


def serve_from_elsewhere(exe: Path, source: Path, tmp_path: Path) -> Path:
    """The installed `exe serve`, started outside the checkout, serves the dashboard and found
    the sound build's CPU check passed; returns the folder it ran in."""
    away = tmp_path / "elsewhere"
    away.mkdir()
    server = start([str(exe)], away, tmp_path / "serve.log")
    try:
        check_dashboard(server.url, static_files(source))
    finally:
        server.stop()
    assert_cpu_check_passed(server.log)
    return away


def test_pip_install_into_a_fresh_venv_serves_the_dashboard(
    wheel: Path, wheelhouse: Path, source: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # llama-cpp-python from the wheelhouse tests/run.sh built, not compiled again.
    t0 = time.monotonic()
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        env=outside_env(PIP_FIND_LINKS=str(wheelhouse)),
        timeout=600,
    )
    print(f"\npip install of the wheel and its dependencies: {time.monotonic() - t0:.0f}s")
    assert_llama_cpp_from(wheelhouse, venv / "bin/python")
    away = serve_from_elsewhere(venv / "bin/batchyard", source, tmp_path)
    # It ran the installed package, not the checkout.
    assert (away / "batchyard-data" / "batchyard.db").is_file()


def test_pipx_install_of_the_checkout_serves_the_dashboard(
    source: Path, wheelhouse: Path, tmp_path: Path
) -> None:
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
        # The pip inside pipx's venv finds the sound wheel there, as a user's pip.conf would.
        "PIP_FIND_LINKS": str(wheelhouse),
    }
    # The README's command, run in the clean clone: `pipx install .`
    t0 = time.monotonic()
    subprocess.run(
        [str(tools / "bin/pipx"), "install", "."],
        cwd=source,
        check=True,
        env=outside_env(**pipx_env),
        timeout=600,
        capture_output=True,
    )
    print(f"\npipx install .: {time.monotonic() - t0:.0f}s")
    exe = tmp_path / "bin" / "batchyard"
    assert exe.exists()
    assert_llama_cpp_from(wheelhouse, tmp_path / "pipx" / "venvs" / "batchyard" / "bin" / "python")
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("batchyard ")
    serve_from_elsewhere(exe, source, tmp_path)
