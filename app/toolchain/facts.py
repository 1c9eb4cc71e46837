"""What is installed and what is in sight, from the parent's side: where llama.cpp's libraries
are, which GPU backends the build has, whether nvidia-smi lists a GPU and its free memory,
how many threads to use, and the one command that fixes a build. Nothing here imports
llama_cpp; the checks that load a model run in a child process (engine/llama/selfcheck.py)
and answer on one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llama-cpp-python"
#: The version pyproject.toml pins (a unit test keeps the two the same).
LLAMA_CPP_VERSION = "0.3.36"
#: ggml's library of each GPU backend, as a build installs it in llama_cpp/lib.
GPU_LIBRARIES = {"cuda": "ggml-cuda", "metal": "ggml-metal", "vulkan": "ggml-vulkan"}
#: How a check's child starts its answer line on its standard output.
ANSWER = "selfcheck: "


def cpu_threads(requested: int) -> int:
    """Threads for llama.cpp: the request, or every core this process may run on."""
    if requested > 0:
        return requested
    # llama.cpp's own default is a fixed 4, which oversubscribes small machines.
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def llama_lib_dir() -> Path:
    import importlib.util

    if os.environ.get("LLAMA_CPP_LIB_PATH"):  # a frozen app's bundle, or the user's choice
        return Path(os.environ["LLAMA_CPP_LIB_PATH"])

    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "lib"


def build_command(backend: str) -> str:
    return f"batchyard engine build --{backend}"


def gpu_libraries(lib_dir: Path | None = None) -> list[str]:
    """The GPU backends the installed build has ("cuda", "metal", "vulkan")."""
    lib_dir = lib_dir or llama_lib_dir()
    names = [p.name for p in lib_dir.iterdir()] if lib_dir.is_dir() else []
    return [b for b, lib in GPU_LIBRARIES.items() if any(lib in n for n in names)]


def visible_nvidia_gpu() -> str | None:
    """The first NVIDIA GPU `nvidia-smi -L` lists, or None (no GPU, or no driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return gpus[0] if out.returncode == 0 and gpus else None


def free_vram_bytes(lib_dir: Path | None = None) -> int | None:
    """The free memory of every GPU `nvidia-smi` lists, in bytes, on a CUDA build: the models'
    budget there (catalog/budget.py). Summed, as llama.cpp splits a model's layers over every
    GPU it sees. None on a build without CUDA, or where nvidia-smi lists no GPU or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None or "cuda" not in gpu_libraries(lib_dir):
        return None
    query = [smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    mib = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not mib or not all(m.isdigit() for m in mib):
        return None  # "[N/A]" or an error text: no figure to trust
    return sum(int(m) for m in mib) << 20


def cpu_fallback(gpu_built: list[str], gpu_seen: str | None) -> str | None:
    """The start-up line (and /health's `gpu_fallback`, `engine status`'s line) of a CUDA
    build on a machine where nvidia-smi lists no GPU: it runs, on the CPU. None otherwise."""
    if "cuda" not in gpu_built or gpu_seen:
        return None
    return (
        "llama-cpp-python is built with CUDA, but no GPU is visible (nvidia-smi lists none): "
        "the engine runs on the CPU."
    )


def advice(
    *, extra_ok: bool | None, why: str, gpu_built: list[str], gpu_seen: str | None
) -> str | None:
    """The command that fixes the build, or None when nothing needs fixing.

    A visible NVIDIA GPU with a CPU-only build wants CUDA; on the CPU, a check that crashed,
    disagreed or could not run wants the fix build (a setting that turned it off does not).
    """
    if getattr(sys, "frozen", False):  # the single binary carries its own build
        return None
    if gpu_seen and "cuda" not in gpu_built:
        return (
            f"An NVIDIA GPU is visible ({gpu_seen}) but llama-cpp-python was built for the CPU "
            f"only: run `{build_command('cuda')}`, then serve with --n-gpu-layers -1."
        )
    if extra_ok is False and not why.startswith("cpu_extra_buffers="):
        return (
            f"llama.cpp's fast CPU buffer types are off ({why}): run "
            f"`{build_command('cpu')}` to rebuild llama-cpp-python with the fix."
        )
    return None


@dataclass
class ChildAnswer:
    """How a check's child ended: its last answer line (None if it gave none) and exit code."""

    answer: str | None
    returncode: int


def run_child(command: list[str], timeout: float) -> ChildAnswer:
    """Run a check in a fresh process (a crash must not take this one with it) and keep the
    last line it starts with ANSWER. Raises subprocess.TimeoutExpired past `timeout`."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    answers = [line for line in done.stdout.splitlines() if line.startswith(ANSWER)]
    return ChildAnswer(answers[-1].removeprefix(ANSWER) if answers else None, done.returncode)


def child_program(hidden: str, module: str, *args: str) -> list[str]:
    """The command line of one of batchyard's own child programs: the hidden subcommand
    `hidden` in the single binary (where sys.executable is batchyard itself), else this
    Python running `module`."""
    if getattr(sys, "frozen", False):
        return [sys.executable, hidden, *args]
    return [sys.executable, "-m", module, *args]


def selfcheck_command(*args: str) -> list[str]:
    """The command line of engine/llama/selfcheck.py's child with `args` (`cpu MODEL THREADS`
    or `gpu MODEL`): `batchyard _selfcheck` in the single binary."""
    return child_program(SELFCHECK_COMMAND, "app.engine.llama.selfcheck", *args)


#: The hidden `batchyard` subcommand a frozen app runs the checks through (app/cli/__init__.py: main).
SELFCHECK_COMMAND = "_selfcheck"
