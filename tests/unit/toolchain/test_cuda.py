"""The CUDA build's inputs: architectures chosen, cuBLAS found, the flags given to CMake, and
the architectures read back from a built library."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from app import cli
from app.toolchain import build, cuda, facts

TINY = Path(__file__).parents[2] / "data" / "cuda" / "libggml-cuda-tiny.so"


def test_built_archs_reads_machine_code_and_ptx_entries_of_the_fatbinary() -> None:
    assert cuda.built_archs(TINY) == ["sm_80", "compute_90"]


def test_built_archs_of_a_library_without_cuda_code_is_empty(tmp_path: Path) -> None:
    plain = tmp_path / "libggml-cpu.so"
    plain.write_bytes(b"\x7fELF" + b"\0" * 200)
    assert cuda.built_archs(plain) == []
    assert cuda.built_archs(tmp_path / "missing.so") == []


@pytest.mark.parametrize(
    ("given", "archs"),
    [("90", ["90"]), ("80;89;90", ["80", "89", "90"]), ("8.9,sm_90", ["89", "90"])],
)
def test_parse_archs_takes_cmake_lists_and_capabilities(given: str, archs: list[str]) -> None:
    assert cuda.parse_archs(given) == archs


@pytest.mark.parametrize("given", ["", ";", "hopper", "9"])
def test_parse_archs_refuses_what_is_no_architecture(given: str) -> None:
    with pytest.raises(cuda.CudaError, match="--cuda-arch"):
        cuda.parse_archs(given)


def test_choose_archs_prefers_the_flag_then_the_visible_gpus_then_supported_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cuda, "visible_archs", lambda: ["90"])
    monkeypatch.setattr(cuda, "nvcc_archs", lambda: ["80", "86", "89", "90", "100"])
    assert cuda.choose_archs("80;90") == (["80", "90"], "--cuda-arch")
    assert cuda.choose_archs(None)[0] == ["90"]
    monkeypatch.setattr(cuda, "visible_archs", list)
    archs, why = cuda.choose_archs(None)
    assert archs == ["80", "86", "89", "90"]  # CUDA 13's nvcc has no 75 in this case
    assert "no GPU in sight" in why
    monkeypatch.setattr(cuda, "nvcc_archs", lambda: ["120"])
    with pytest.raises(cuda.CudaError, match="--cuda-arch"):
        cuda.choose_archs(None)


def test_find_cublas_names_the_versioned_libraries_of_the_wheel(tmp_path: Path) -> None:
    base = tmp_path / "nvidia" / "cu13"
    (base / "include").mkdir(parents=True)
    (base / "lib").mkdir()
    (base / "include" / "cublas_v2.h").write_text("")
    assert cuda.find_cublas(tmp_path) is None  # headers without libraries
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (base / "lib" / name).write_bytes(b"")
    found = cuda.find_cublas(tmp_path)
    assert found is not None
    assert (found.cublas.name, found.cublas_lt.name) == ("libcublas.so.13", "libcublasLt.so.13")
    assert found.include == base / "include"


def test_build_flags_of_a_toolkit_without_cublas_or_driver_stub(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = tmp_path / "lib"
    wheel = cuda.Cublas(tmp_path / "inc", lib / "libcublas.so.13", lib / "libcublasLt.so.13")
    monkeypatch.setattr(cuda, "toolkit_has_cublas", lambda: False)
    monkeypatch.setattr(cuda, "toolkit_has_driver_stub", lambda: False)
    monkeypatch.setattr(cuda, "nvcc_version", lambda: (13, 0))
    monkeypatch.setattr(cuda, "fetch_cublas", lambda major: wheel)
    flags = cuda.build_flags(["80", "90"])
    assert flags.cmake == [
        "-DGGML_CUDA=on",
        "-DCMAKE_CUDA_ARCHITECTURES=80;90",
        "-DGGML_CUDA_NO_VMM=ON",
        f"-DCUDA_cublas_LIBRARY={lib}/libcublas.so.13",
        f"-DCUDA_cublasLt_LIBRARY={lib}/libcublasLt.so.13",
        f"-DCMAKE_CUDA_FLAGS=-I{tmp_path}/inc",
    ]
    env = build.compile_env("cuda", flags)
    # The cuBLAS include rides along with the fix header (a -DCMAKE_C_FLAGS would drop it).
    assert env["CFLAGS"].endswith(f"-include {build.FIX_HEADER} -I{tmp_path}/inc")
    assert "-DCMAKE_CUDA_ARCHITECTURES=80;90" in env["CMAKE_ARGS"]
    assert "LLAVA_BUILD" not in env["CMAKE_ARGS"]  # libmtmd is built: image lines need it


def test_build_flags_of_a_full_toolkit_are_the_architectures_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cuda, "toolkit_has_cublas", lambda: True)
    monkeypatch.setattr(cuda, "toolkit_has_driver_stub", lambda: True)
    flags = cuda.build_flags(["90"])
    assert flags.cmake == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    assert flags.c_flags == ""


def test_cuda_plan_says_the_architectures_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "toolkit_has_cublas", lambda: True)
    monkeypatch.setattr(cuda, "toolkit_has_driver_stub", lambda: False)
    out = io.StringIO()
    flags = build.cuda_plan("80;90", out)
    assert "-DCMAKE_CUDA_ARCHITECTURES=80;90" in flags.cmake
    assert "CUDA architectures: 80;90 (--cuda-arch)" in out.getvalue()
    assert "GGML_CUDA_NO_VMM=ON" in out.getvalue()
    with pytest.raises(cuda.CudaError, match="'nine'"):
        build.cuda_plan("nine", out)


def test_status_names_the_architectures_of_a_cuda_build() -> None:
    status = build.Status(
        version="0.3.36",
        location="/x",
        gpu_built=["cuda"],
        gpu_seen=None,
        cuda_archs=["sm_90"],
        extra_ok=True,
        why="",
        advice=None,
    )
    assert "CUDA architectures: sm_90" in status.lines()


def test_cuda_arch_goes_with_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["engine", "build", "--cpu", "--cuda-arch", "90"]) == 2
    assert "--cuda-arch goes with --cuda" in capsys.readouterr().err


def test_a_cuda_build_without_a_gpu_in_sight_says_it_runs_on_the_cpu() -> None:
    line = facts.cpu_fallback(["cuda"], None)
    assert line == (
        "llama-cpp-python is built with CUDA, but no GPU is visible (nvidia-smi lists none): "
        "the engine runs on the CPU."
    )
    assert facts.cpu_fallback(["cuda"], "GPU 0: NVIDIA H200") is None
    assert facts.cpu_fallback([], None) is None
    status = build.Status("0.3.36", "/x", ["cuda"], None, ["sm_90"], True, "", None)
    assert line in status.lines()


def test_needed_runtime_lists_the_linked_cuda_libraries_in_loading_order(tmp_path: Path) -> None:
    lib = tmp_path / "libggml-cuda.so"
    lib.write_bytes(
        b"\x7fELF\0libcublas.so.13\0libggml-base.so\0libcudart.so.13\0libcublasLt.so.13\0"
    )
    assert cuda.needed_runtime(lib) == ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]


def test_preload_runtime_does_nothing_for_a_build_without_cuda(tmp_path: Path) -> None:
    (tmp_path / "libggml-cpu.so").write_bytes(b"")
    assert cuda.preload_runtime(tmp_path) == []
    assert cuda.preload_runtime(tmp_path / "missing") == []


def test_a_cuda_build_with_no_gpu_in_sight_is_kept_when_it_loads_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An image build has no GPU to check on: the build is kept if it loads and runs."""
    from app.config import Settings

    asked: list[list[str]] = []

    def child(answer: str | None) -> object:
        def run(command: list[str], timeout: float) -> facts.ChildAnswer:
            asked.append(command)
            return facts.ChildAnswer(answer, 0 if answer else -11)

        return run

    monkeypatch.setattr(build, "visible_nvidia_gpu", lambda: None)
    monkeypatch.setattr(build, "run_child", child("ok"))
    ok, why = build.verify("cuda", Settings())
    assert ok and "no GPU visible" in why and "loads and runs on the CPU" in why
    assert asked[-1][-3] == "cpu"  # the CPU check's child, not the GPU one
    monkeypatch.setattr(build, "run_child", child(None))
    ok, why = build.verify("cuda", Settings())
    assert not ok and "exit code -11" in why
    monkeypatch.setattr(build, "run_child", child("error: OSError: libcublas.so.13"))
    ok, why = build.verify("cuda", Settings())
    assert not ok and "libcublas.so.13" in why


def test_fetch_cublas_takes_a_wheel_already_in_the_environment_before_pypi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site = tmp_path / "site-packages"
    base = site / "nvidia" / "cu13"
    (base / "include").mkdir(parents=True)
    (base / "lib").mkdir()
    (base / "include" / "cublas_v2.h").write_text("")
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (base / "lib" / name).write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setenv(cuda.CACHE_ENV, str(tmp_path / "cache"))
    found = cuda.fetch_cublas(13)  # no pip run: it would need the network
    assert found.cublas == base / "lib" / "libcublas.so.13"
    assert not (tmp_path / "cache").exists()
