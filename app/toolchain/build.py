"""`batchyard engine build` and `batchyard engine status`: the llama.cpp build batchyard runs on.

`build` recompiles llama-cpp-python, at the version batchyard pins, inside batchyard's own
environment (`sys.executable`'s pip), with the fix header shipped in this package
(amx_tilecfg.h: GCC 12 otherwise miscompiles ggml's AMX kernels) and the backend's CMake
flags. It saves the installed build as a wheel first, installs the new one, checks it (the
CPU check of cpu_check.py, or one layer loaded on the GPU by engine/llama/selfcheck.py) and reinstalls the saved wheel
if the check fails. A prebuilt wheel (`--wheel`, or BATCHYARD_ENGINE_WHEELHOUSE) stands in
for the compile.

`status` says which backend and CPU buffer types are in use and why; `advice` is the one
command that would fix what is wrong, for the start-up log, /health and the dashboard.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from app.config import Settings
from app.toolchain import cpu_check, cuda
from app.toolchain.facts import (
    LLAMA_CPP_VERSION,
    PACKAGE,
    advice,
    build_command,
    cpu_fallback,
    cpu_threads,
    gpu_libraries,
    llama_lib_dir,
    run_child,
    selfcheck_command,
    visible_nvidia_gpu,
)

FIX_HEADER = Path(__file__).with_name("amx_tilecfg.h")
#: CMake flags of each backend (`--cpu` needs none). libmtmd, the multimodal library, is built
#: with every backend: image lines need it.
BACKENDS = {
    "cpu": "",
    "cuda": "-DGGML_CUDA=on",
    "metal": "-DGGML_METAL=on",
    "vulkan": "-DGGML_VULKAN=on",
}
#: Where a prebuilt wheel may come from instead of a compile (a file or a wheelhouse dir).
WHEELHOUSE_ENV = "BATCHYARD_ENGINE_WHEELHOUSE"
GPU_CHECK_TIMEOUT_S = 300.0
#: Lines of the compiler's output kept to show when the build fails.
TAIL_LINES = 40


class BuildError(Exception):
    pass


# -- what is installed ----------------------------------------------------------------


@dataclass
class Status:
    version: str | None
    location: str
    gpu_built: list[str]
    gpu_seen: str | None
    cuda_archs: list[str]  # what the CUDA library holds code for; empty without one
    extra_ok: bool | None  # None: not checked yet for this build
    why: str
    advice: str | None

    @property
    def backend(self) -> str:
        return "+".join(b.upper() for b in self.gpu_built) or "CPU"

    def lines(self) -> list[str]:
        if self.version is None:
            return [f"{PACKAGE} is not installed: run `{build_command('cpu')}`."]
        buffers = (
            "not checked yet for this build (`batchyard serve` checks at start; "
            "`batchyard engine status --check` checks now)"
            if self.extra_ok is None
            else f"{'on' if self.extra_ok else 'off'} ({self.why})"
        )
        gpu_note = (
            f"built with {', '.join(self.gpu_built)}" if self.gpu_built else "no GPU backend built"
        )
        archs = (
            [f"CUDA architectures: {', '.join(self.cuda_archs) or 'none found in the library'}"]
            if "cuda" in self.gpu_built
            else []
        )
        return [
            f"llama-cpp-python {self.version} ({self.location})",
            f"backend: {self.backend} ({gpu_note})",
            *archs,
            f"GPU seen: {self.gpu_seen or 'none (nvidia-smi lists no GPU)'}",
            *([fallback] if (fallback := cpu_fallback(self.gpu_built, self.gpu_seen)) else []),
            f"CPU extra buffer types (AMX, repacked weights): {buffers}",
            f"fix: {self.advice}" if self.advice else "fix: nothing to fix",
        ]


def status(settings: Settings, *, check: bool = False) -> Status:
    """The installed build, the GPU in sight, and the CPU check's verdict (run with `check`,
    else only read from its cache)."""
    try:
        version: str | None = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    lib_dir = llama_lib_dir() if version else Path()
    threads = cpu_threads(settings.threads)
    model = settings.model_path
    verdict: tuple[bool, str] | None
    if settings.cpu_extra_buffers in ("on", "off"):
        verdict = (
            settings.cpu_extra_buffers == "on",
            f"cpu_extra_buffers={settings.cpu_extra_buffers}",
        )
    elif version and check:
        verdict = cpu_check.extra_buffers(model, threads, "auto", settings.cache_path)
    elif version:
        verdict = cpu_check.cached_verdict(model, threads, settings.cache_path)
        if verdict is not None:
            verdict = (
                verdict[0],
                f"{verdict[1]}; cached for this build, model and {threads} threads",
            )
    else:
        verdict = None
    gpu_built = gpu_libraries(lib_dir) if version else []
    gpu_seen = visible_nvidia_gpu()
    extra_ok, why = verdict if verdict is not None else (None, "")
    cuda_lib = next(iter(sorted(lib_dir.glob("libggml-cuda*.so*"))), None) if version else None
    return Status(
        version=version,
        location=str(lib_dir.parent) if version else "",
        gpu_built=gpu_built,
        gpu_seen=gpu_seen,
        cuda_archs=cuda.built_archs(cuda_lib) if cuda_lib else [],
        extra_ok=extra_ok,
        why=why,
        advice=advice(extra_ok=extra_ok, why=why, gpu_built=gpu_built, gpu_seen=gpu_seen),
    )


# -- build ----------------------------------------------------------------------------


def save_installed(dest: Path) -> Path | None:
    """The installed llama-cpp-python packed back into a wheel in `dest` (so a failed build
    can be undone with pip), or None when none is installed."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    root = Path(str(dist.locate_file("")))
    files = [str(f) for f in dist.files or []]
    info = next(f.rsplit("/", 1)[0] for f in files if f.endswith(".dist-info/METADATA"))
    tag = next(
        (line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
         if line.startswith("Tag:")),
        "py3-none-any",
    )  # fmt: skip
    skip = {f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/REQUESTED", f"{info}/direct_url.json"}
    wheel = dest / f"llama_cpp_python-{dist.version}-{tag}.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name in files:
            path = root / name
            if name.startswith("..") or "__pycache__" in name or name in skip:
                continue  # scripts outside site-packages, byte code, install records
            if not path.is_file():
                continue
            data = path.read_bytes()
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{name},sha256={digest.decode()},{len(data)}")
        records.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return wheel


def prebuilt_wheel(given: str | None) -> Path | None:
    """The wheel to install instead of compiling: `--wheel`, else BATCHYARD_ENGINE_WHEELHOUSE
    (a wheel file, or a directory holding the pinned version's wheel)."""
    where = given or os.environ.get(WHEELHOUSE_ENV)
    if not where:
        return None
    path = Path(where).expanduser()
    if path.is_dir():
        found = sorted(path.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl"))
        if not found:
            raise BuildError(f"{path} holds no llama_cpp_python-{LLAMA_CPP_VERSION} wheel")
        return found[-1]
    if not path.is_file():
        raise BuildError(f"no such wheel: {path}")
    return path


def compile_env(backend: str, cuda_flags: cuda.CudaFlags | None = None) -> dict[str, str]:
    """The environment pip builds in: the fix header ahead of every source, and the flags
    (a CUDA build's come from cuda.build_flags: architectures, cuBLAS)."""
    env = dict(os.environ)
    include = f"-include {FIX_HEADER}"
    if cuda_flags is not None and cuda_flags.c_flags:
        include += f" {cuda_flags.c_flags}"
    for var in ("CFLAGS", "CXXFLAGS"):
        env[var] = f"{env.get(var, '')} {include}".strip()
    backend_flags = " ".join(cuda_flags.cmake) if cuda_flags is not None else BACKENDS[backend]
    env["CMAKE_ARGS"] = " ".join(x for x in (env.get("CMAKE_ARGS", ""), backend_flags) if x)
    return env


def _pip(
    args: list[str],
    out: TextIO,
    env: dict[str, str] | None = None,
    show: Callable[[str], bool] | None = None,
) -> None:
    """`python -m pip ARGS` in this environment; lines `show` accepts go to `out` as they
    come, and the last lines are shown when it fails."""
    cmd = [sys.executable, "-m", "pip", *args]
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            if show is None or show(line):
                out.write("  " + line if not line.startswith("  ") else line)
                out.flush()
    if proc.returncode != 0:
        raise BuildError(
            f"pip {' '.join(args[:2])} failed (exit {proc.returncode}); its last lines:\n"
            + "\n".join(tail)
        )


def _compile_progress(line: str) -> bool:
    """Which of pip's verbose lines show progress: cmake's [ NN%] steps and pip's own."""
    s = line.strip()
    return (s.startswith("[") and "%]" in s[:8]) or s.startswith(
        ("Building wheel", "Created wheel", "Successfully", "error", "ERROR", "CMake Error")
    )


def compile_wheel(
    backend: str, dest: Path, out: TextIO, cuda_flags: cuda.CudaFlags | None = None
) -> Path:
    _pip(
        ["wheel", "-v", "--no-deps", "--no-cache-dir", "--no-binary", PACKAGE,
         f"{PACKAGE}=={LLAMA_CPP_VERSION}", "-w", str(dest)],
        out,
        env=compile_env(backend, cuda_flags),
        show=_compile_progress,
    )  # fmt: skip
    found = sorted(dest.glob("llama_cpp_python-*.whl"))
    if not found:
        raise BuildError(f"pip built no wheel into {dest}")
    return found[-1]


def install(wheel: Path, out: TextIO) -> None:
    _pip(["install", "--force-reinstall", "--no-deps", "--no-cache-dir", "-q", str(wheel)], out)


def verify(backend: str, settings: Settings) -> tuple[bool, str]:
    """Check the build just installed, in a fresh process (this one has the old one)."""
    model = settings.model_path
    if backend == "cpu":
        threads = cpu_threads(settings.threads)
        ok, why = cpu_check.extra_buffers(model, threads, "auto", settings.cache_path)
        return ok, f"CPU check: {why}"
    if backend == "cuda" and visible_nvidia_gpu() is None:
        # An image build or a CI runner: no GPU to check on. The build must still load and
        # run (on the CPU, as it will wherever no GPU is visible); the GPU is checked where
        # it runs (`batchyard engine status`, the start-up line).
        n = str(cpu_threads(settings.threads))
        try:
            done = run_child(selfcheck_command("cpu", str(model), n), GPU_CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, f"load check: no answer in {GPU_CHECK_TIMEOUT_S:.0f} s"
        if done.answer is None or done.answer.startswith("error"):
            return False, (
                "no GPU visible, and the build did not load and run on the CPU: "
                f"{done.answer or f'ended without an answer (exit code {done.returncode})'}"
            )
        return True, (
            "no GPU visible (nvidia-smi lists none), so no GPU check: the build loads and "
            "runs on the CPU; on a machine with a GPU it offloads there"
        )
    try:
        done = run_child(selfcheck_command("gpu", str(model)), GPU_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"GPU check: no answer in {GPU_CHECK_TIMEOUT_S:.0f} s"
    if done.answer is None:
        return False, f"GPU check: ended without an answer (exit code {done.returncode})"
    return done.answer.startswith("ok"), f"GPU check: {done.answer}"


def cuda_plan(cuda_arch: str | None, out: TextIO) -> cuda.CudaFlags:
    """The CUDA build's flags, said before the compile: the architectures and why, cuBLAS's
    source and whether the driver stub is missing. Raises cuda.CudaError before any compile."""
    archs, why = cuda.choose_archs(cuda_arch)
    print(f"  CUDA architectures: {';'.join(archs)} ({why})", file=out, flush=True)
    flags = cuda.build_flags(archs)
    if not cuda.toolkit_has_cublas():
        print(f"  cuBLAS: from the nvidia-cublas wheel in {cuda.cache_dir()} (the toolkit has none)",
              file=out)  # fmt: skip
    if "-DGGML_CUDA_NO_VMM=ON" in flags.cmake:
        print("  no libcuda.so stub in the toolkit: GGML_CUDA_NO_VMM=ON", file=out, flush=True)
    return flags


def build(
    backend: str,
    settings: Settings,
    out: TextIO,
    *,
    wheel: str | None = None,
    cuda_arch: str | None = None,
) -> int:
    """The whole `engine build`: save, build (or take a prebuilt wheel), install, check, and
    reinstall the saved build if the check fails. Returns the exit code."""
    if getattr(sys, "frozen", False):
        print("batchyard engine build: the single binary carries its own build; "
              "rebuild it with packaging/build.sh instead.", file=out)  # fmt: skip
        return 2
    t0 = time.monotonic()

    def phase(n: int, text: str) -> None:
        print(f"engine build [{n}/4] {text}", file=out, flush=True)

    with tempfile.TemporaryDirectory(prefix="batchyard-engine-") as tmp:
        work = Path(tmp)
        (work / "saved").mkdir()
        (work / "new").mkdir()
        phase(1, "saving the installed llama-cpp-python, to fall back to")
        saved = save_installed(work / "saved")
        print(f"  {saved.name if saved else 'none installed'}", file=out)
        try:
            given = prebuilt_wheel(wheel)
            if given is not None:
                phase(2, f"taking the prebuilt wheel {given} (no compile)")
                new = given
            else:
                flags = cuda_plan(cuda_arch, out) if backend == "cuda" else None
                phase(
                    2,
                    f"compiling llama-cpp-python {LLAMA_CPP_VERSION} for {backend.upper()} with "
                    f"{FIX_HEADER.name} (several minutes; CMAKE_ARGS="
                    f"{compile_env(backend, flags)['CMAKE_ARGS']!r})",
                )
                new = compile_wheel(backend, work / "new", out, flags)
            phase(3, f"installing {new.name} into {sys.prefix}")
            install(new, out)
        except (BuildError, cuda.CudaError) as exc:
            print(f"engine build: {exc}\nThe installed build is unchanged.", file=out)
            return 1
        where = (
            ""
            if backend == "cpu"
            else " (no GPU visible: it loads and runs on the CPU)"
            if backend == "cuda" and visible_nvidia_gpu() is None
            else " on the GPU"
        )
        phase(4, f"checking the new build{where}")
        ok, why = verify(backend, settings)
        print(f"  {why}", file=out, flush=True)
        if not ok:
            if saved is None:
                print("engine build: the check failed and there was no build to go back to.",
                      file=out)  # fmt: skip
                return 1
            print(f"engine build: the check failed; reinstalling the previous build {saved.name}",
                  file=out, flush=True)  # fmt: skip
            try:
                install(saved, out)
            except BuildError as exc:
                print(f"engine build: could not reinstall the previous build: {exc}", file=out)
            return 1
    print(
        f"engine build: done in {time.monotonic() - t0:.0f} s; llama-cpp-python "
        f"{LLAMA_CPP_VERSION} for {backend.upper()} is installed in {sys.prefix}.",
        file=out,
    )
    return 0
