"""`batchyard engine`: the pinned version, the build's flags, the advice, and a GPU in sight
with a CPU-only build named (with the fixing command) in the start-up log, /health and the
dashboard's model page."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import tomllib

from app.toolchain import build
from tests.live import OUTPUT, ROOT, batchyard, start_server, stop_server


def test_the_pin_is_pyprojects() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"llama-cpp-python=={build.LLAMA_CPP_VERSION}" in deps


def test_the_fix_header_ships_in_the_package_and_the_wheel_script_uses_it() -> None:
    assert build.FIX_HEADER == ROOT / "app/toolchain/amx_tilecfg.h"
    assert "_tile_loadconfig" in build.FIX_HEADER.read_text()
    assert not (ROOT / "packaging/amx_tilecfg.h").exists()  # one copy
    assert "FIX=app/toolchain/amx_tilecfg.h" in (ROOT / "packaging/llama_wheel.sh").read_text()


def test_compile_flags_per_backend(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CFLAGS", "-O2")
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    env = build.compile_env("cuda")
    assert env["CFLAGS"] == f"-O2 -include {build.FIX_HEADER}"
    assert env["CXXFLAGS"].endswith(f"-include {build.FIX_HEADER}")
    assert "-DGGML_CUDA=on" in env["CMAKE_ARGS"]
    assert "GGML" not in build.compile_env("cpu")["CMAKE_ARGS"]
    assert "-DGGML_METAL=on" in build.compile_env("metal")["CMAKE_ARGS"]
    assert "-DGGML_VULKAN=on" in build.compile_env("vulkan")["CMAKE_ARGS"]


def test_advice_names_the_command() -> None:
    crashed = build.advice(
        extra_ok=False, why="the check crashed (SIGSEGV)", gpu_built=[], gpu_seen=None
    )
    assert crashed and "`batchyard engine build --cpu`" in crashed and "SIGSEGV" in crashed
    gpu = build.advice(extra_ok=True, why="ok", gpu_built=[], gpu_seen="GPU 0: NVIDIA H200")
    assert gpu and "`batchyard engine build --cuda`" in gpu
    assert build.advice(extra_ok=True, why="ok", gpu_built=["cuda"], gpu_seen="GPU 0: X") is None
    assert (
        build.advice(extra_ok=False, why="cpu_extra_buffers=off", gpu_built=[], gpu_seen=None)
        is None
    )
    assert build.advice(extra_ok=True, why="the check passed", gpu_built=[], gpu_seen=None) is None


def test_save_installed_packs_the_very_files(tmp_path: Path) -> None:
    import zipfile

    from app.toolchain import facts

    wheel = build.save_installed(tmp_path)
    assert wheel is not None and wheel.name.startswith(
        f"llama_cpp_python-{build.LLAMA_CPP_VERSION}-"
    )
    lib = facts.llama_lib_dir()
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for so in lib.glob("lib*.so"):
            assert z.read(f"llama_cpp/lib/{so.name}") == so.read_bytes()
        assert any(n.endswith(".dist-info/RECORD") for n in names)
        assert not any("__pycache__" in n for n in names)


def test_status_reads_the_cached_verdict() -> None:
    r = batchyard("engine", "status", "--cpu-extra-buffers", "off")
    assert r.returncode == 0, r.stderr
    assert "backend: CPU" in r.stdout
    assert "off (cpu_extra_buffers=off)" in r.stdout
    assert "fix: nothing to fix" in r.stdout


def test_a_visible_gpu_with_a_cpu_build_is_named_with_its_fix(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-test)'\n")
    smi.chmod(0o755)
    import os

    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    server = start_server(tmp_path / "data", OUTPUT / "gpu-advice-server.log", env=env)
    try:
        health = httpx.get(server.url + "/health").json()
        assert "`batchyard engine build --cuda`" in health["advice"]
        assert health["cpu_buffers"].startswith(("on (", "off ("))
        page = httpx.get(server.url + "/engines").text
        assert "batchyard engine build --cuda" in page
        assert re.search(r"NVIDIA H200", page)
    finally:
        stop_server(server)
    assert "batchyard engine build --cuda" in server.log()
    status = batchyard("engine", "status", env=env)
    assert "GPU seen: GPU 0: NVIDIA H200" in status.stdout
    assert "fix: An NVIDIA GPU is visible" in status.stdout
