"""`batchyard engine build --cpu` in a throwaway venv (early.py's `engine-venv`, made while
the suite runs), with the wheelhouse's prebuilt wheel standing in for the compile: it
installs, passes the CPU check, and `engine status` says so; a broken build fails the check
and the previous build is put back, byte for byte."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from app.config import bundled_model_path
from tests.live import ROOT, checkout_env
from tests.packaging import early
from tests.packaging.helpers import assert_llama_cpp_from

pytestmark = pytest.mark.slow


def engine(python: Path, cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "app.cli", "engine", *args,
         "--model", str(bundled_model_path()), "--cache-dir", str(cache)],
        cwd=ROOT,
        env=checkout_env({"BATCHYARD_CPU_EXTRA_BUFFERS": "auto", **env}),
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip


def broken_copy(wheel: Path, dest: Path) -> Path:
    """The same wheel with ggml's CPU backend replaced by junk: it installs, and cannot run."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.startswith("llama_cpp/lib/libggml-cpu"):
                data = b"\x7fELF not really" + bytes(64)
            dst.writestr(item, data)
    return out


def test_engine_build_installs_checks_and_falls_back(wheelhouse: Path, tmp_path: Path) -> None:
    made = early.finish("engine-venv", timeout=900)
    assert made.code == 0, made.output
    venv = made.root / "venv"
    python = venv / "bin/python"
    (wheel,) = wheelhouse.glob("llama_cpp_python-*.whl")
    cache = tmp_path / "cache"

    # The wheelhouse stands in for the compile (BATCHYARD_ENGINE_WHEELHOUSE).
    built = engine(python, cache, "build", "--cpu", BATCHYARD_ENGINE_WHEELHOUSE=str(wheelhouse))
    print(built.stdout, built.stderr)
    assert built.returncode == 0, built.stdout + built.stderr
    for n in range(1, 5):
        assert f"engine build [{n}/4]" in built.stdout
    assert "CPU check: the check passed" in built.stdout
    assert_llama_cpp_from(wheelhouse, python)
    status = engine(python, cache, "status")
    assert status.returncode == 0, status.stderr
    assert str(venv) in status.stdout
    assert "backend: CPU" in status.stdout
    assert "CPU extra buffer types (AMX, repacked weights): on (the check passed" in status.stdout
    assert "fix: nothing to fix" in status.stdout

    # A build that cannot run fails the check, and the saved build goes back in.
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = broken_copy(wheel, bad_dir)
    failed = engine(python, cache, "build", "--cpu", "--wheel", str(bad))
    print(failed.stdout, failed.stderr)
    assert failed.returncode == 1
    assert "the check failed; reinstalling the previous build" in failed.stdout
    assert_llama_cpp_from(wheelhouse, python)
    again = engine(python, cache, "status")
    assert "on (the check passed" in again.stdout, again.stdout
    shutil.rmtree(venv)
