"""The models' memory budget: --models-memory, else the free RAM or (a GPU build) the free
VRAM that a stand-in `nvidia-smi` on PATH reports, each less the margin."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.catalog import budget
from app.catalog.budget import GIB, MARGIN, free_ram_bytes, gib, memory_budget
from app.config import Settings
from app.toolchain import facts

MEMINFO = """MemTotal:       24683792 kB
MemFree:         1048576 kB
MemAvailable:    8388608 kB
Buffers:          123456 kB
"""


def stand_in_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """An `nvidia-smi` first on PATH that runs `body` (sh), and a llama.cpp lib dir with
    ggml's CUDA library in it: what a CUDA build on a GPU machine shows."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libggml-cuda.so").write_bytes(b"")
    return lib


def test_the_given_budget_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = stand_in_smi(tmp_path, monkeypatch, "echo 81559")
    settings = Settings(models_memory="3GiB", n_gpu_layers=-1)
    assert memory_budget(settings, free_vram=facts.free_vram_bytes(lib)) == 3 * GIB


def test_measured_ram_is_mem_available_less_the_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine's own figure first: what the kernel says is available, less the margin
    # (give or take what other programs did between the reads).
    before = free_ram_bytes()
    measured = memory_budget(Settings())
    after = free_ram_bytes()
    slack = 256 << 20
    assert min(before, after) - MARGIN - slack <= measured <= max(before, after) - MARGIN + slack
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    monkeypatch.setattr(budget, "MEMINFO", meminfo)
    assert free_ram_bytes() == 8 * GIB
    assert memory_budget(Settings()) == 7 * GIB


def test_meminfo_without_mem_available_says_to_set_the_flag(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683792 kB\n")
    with pytest.raises(OSError, match="--models-memory"):
        free_ram_bytes(meminfo)
    with pytest.raises(OSError, match="--models-memory"):
        free_ram_bytes(tmp_path / "missing")


def test_a_gpu_build_budgets_the_free_vram_of_every_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The query the stand-in answers is the one batchyard asks: anything else is an error.
    lib = stand_in_smi(
        tmp_path,
        monkeypatch,
        'if [ "$*" = "--query-gpu=memory.free --format=csv,noheader,nounits" ]; then\n'
        "  echo 20480; echo 4096\nelse exit 9; fi",
    )
    free = facts.free_vram_bytes(lib)
    assert free == (20480 + 4096) << 20
    assert memory_budget(Settings(n_gpu_layers=-1), free_vram=free) == 23 * GIB
    # Models on the CPU (--n-gpu-layers 0) are budgeted in RAM even on a GPU build.
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    monkeypatch.setattr(budget, "MEMINFO", meminfo)
    assert memory_budget(Settings(n_gpu_layers=0), free_vram=free) == 7 * GIB


def test_no_vram_figure_without_a_cuda_build_or_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = stand_in_smi(tmp_path, monkeypatch, "echo 20480")
    cpu_only = tmp_path / "cpu-lib"
    cpu_only.mkdir()
    (cpu_only / "libggml-cpu.so").write_bytes(b"")
    assert facts.free_vram_bytes(cpu_only) is None
    assert facts.free_vram_bytes(lib) == 20480 << 20
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho '[N/A]'\n")
    assert facts.free_vram_bytes(lib) is None
    (tmp_path / "bin" / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver'\nexit 9\n"
    )
    assert facts.free_vram_bytes(lib) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert facts.free_vram_bytes(lib) is None


def test_a_budget_never_goes_below_zero() -> None:
    assert memory_budget(Settings(n_gpu_layers=-1), free_vram=MARGIN // 2) == 0


def test_gib_writes_two_decimals() -> None:
    assert gib(0) == "0.00 GiB"
    assert gib(GIB) == "1.00 GiB"
    assert gib(1_320_702_444) == "1.23 GiB"
