"""The wheel carries the templates, the static files and the vendored JS, and the README's
install (install.sh: into a new venv, or through pipx) serves the dashboard from outside the
checkout on the sound llama.cpp build: the wheelhouse's, with the CPU check passed on AMX."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

import app
from tests.packaging import early
from tests.packaging.helpers import (
    assert_cpu_buffers,
    assert_llama_cpp_from,
    check_dashboard,
    files_under,
    outside_env,
    start,
    static_files,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pip_job() -> early.Done:
    """The package's wheel built from a clean copy, and the README's install into a fresh venv
    (`bash install.sh --venv DIR`): started as the session started (conftest.py), beside the
    other tests."""
    done = early.finish("pip", timeout=900)
    assert done.code == 0, done.output
    print("\n" + done.output.strip())
    return done


@pytest.fixture(scope="module")
def wheel(pip_job: early.Done) -> Path:
    (found,) = (pip_job.root / "wheel").glob("batchyard-*.whl")
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


def serve_from_elsewhere(cmd: list[str], source: Path, tmp_path: Path, **env: str) -> Path:
    """The installed `cmd serve`, started outside the checkout, serves the dashboard and
    reports the CPU check's verdict (on, on a CPU with AMX); returns the folder it ran in."""
    away = tmp_path / "elsewhere"
    away.mkdir()
    server = start(cmd, away, tmp_path / "serve.log", **env)
    try:
        check_dashboard(server.url, static_files(source))
        assert_cpu_buffers(server)
    finally:
        server.stop()
    return away


def test_the_readme_venv_install_serves_the_dashboard(
    pip_job: early.Done, wheelhouse: Path, source: Path, tmp_path: Path
) -> None:
    # `bash install.sh --venv DIR && DIR/bin/batchyard serve`, from a clean copy
    venv = pip_job.root / "venv"  # llama-cpp-python from the wheelhouse, not compiled again
    assert_llama_cpp_from(wheelhouse, venv / "bin/python")
    away = serve_from_elsewhere([str(venv / "bin/batchyard")], source, tmp_path)
    # It ran the installed package, not the checkout.
    assert (away / "batchyard-data" / "batchyard.db").is_file()


def test_the_readme_pipx_install_serves_the_dashboard(
    wheelhouse: Path, source: Path, tmp_path: Path
) -> None:
    # `bash install.sh && batchyard serve`, from a clean copy, as the session started
    done = early.finish("pipx", timeout=900)
    assert done.code == 0, done.output
    print("\n" + done.output.strip().splitlines()[-1])
    bin_dir = done.root / "bin"
    assert (bin_dir / "batchyard").exists()
    assert_llama_cpp_from(wheelhouse, done.root / "pipx" / "venvs" / "batchyard" / "bin" / "python")
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    version = subprocess.run(
        ["batchyard", "--version"], capture_output=True, text=True, cwd=tmp_path,
        env=outside_env(PATH=path),
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("batchyard "), version
    serve_from_elsewhere(["batchyard"], source, tmp_path, PATH=path)
