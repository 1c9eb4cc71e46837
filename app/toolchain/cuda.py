"""The CUDA build's inputs: which GPU architectures to compile for, and where cuBLAS comes from.

A Docker image build or a CI runner has the CUDA toolkit but no GPU, so CMake's default of
compiling for the GPUs in sight (`native`) fails there: the architectures are the visible
GPUs' compute capabilities when `nvidia-smi` lists any, otherwise DEFAULT_ARCHS cut down to
what this `nvcc` can compile (CUDA 13 dropped the oldest ones). A toolkit without cuBLAS (the
slim toolkits) gets it from the `nvidia-cublas` wheel on PyPI, installed into a cache
directory: the build then works without a manual step, which is what an image build needs.

`python -m app.toolchain.cuda cmake-args|c-flags [ARCH]` prints the flags, for
packaging/llama_wheel.sh and bench/gpu.sh; `batchyard engine build --cuda` uses the same.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Turing, Ampere (A100, A10/RTX 30), Ada (L4/L40/RTX 40), Hopper (H100/H200): the GPUs a
#: server runs on today; Blackwell and newer run these through PTX of the newest one.
DEFAULT_ARCHS = ("75", "80", "86", "89", "90")
#: The environment variable naming the cache directory of cuBLAS (default under
#: ~/.cache/batchyard/cuda).
CACHE_ENV = "BATCHYARD_CUDA_CACHE"


class CudaError(Exception):
    pass


def cache_dir() -> Path:
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "batchyard" / "cuda"


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def visible_archs() -> list[str]:
    """The compute capabilities of the GPUs nvidia-smi lists ("9.0" -> "90"), none without."""
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"]) if smi else None
    caps = {line.strip().replace(".", "") for line in (out or "").splitlines()}
    return sorted((c for c in caps if c.isdigit()), key=int)


def nvcc() -> Path:
    found = shutil.which("nvcc")
    if found is None:
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        candidate = Path(cuda_home) / "bin" / "nvcc"
        if candidate.is_file():
            return candidate
        raise CudaError(
            "no nvcc: the CUDA build needs the CUDA toolkit (https://developer.nvidia.com/"
            "cuda-downloads); put its bin/ on the PATH or set CUDA_HOME."
        )
    return Path(found)


def nvcc_archs() -> list[str]:
    """The real architectures this nvcc compiles for (`nvcc --list-gpu-arch`)."""
    out = _run([str(nvcc()), "--list-gpu-arch"]) or ""
    return sorted(set(re.findall(r"compute_(\d+)", out)), key=int)


def nvcc_version() -> tuple[int, int]:
    out = _run([str(nvcc()), "--version"]) or ""
    found = re.search(r"release (\d+)\.(\d+)", out)
    if not found:
        raise CudaError(f"cannot read the CUDA version from `{nvcc()} --version`")
    return int(found[1]), int(found[2])


def parse_archs(text: str) -> list[str]:
    """`--cuda-arch` as given: "90", "80;89;90" or "80,90" (also "sm_90", "9.0")."""
    archs = []
    for part in re.split(r"[;, ]+", text.strip()):
        arch = part.lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
        if not arch:
            continue
        if not re.fullmatch(r"\d{2,3}[a-z]?", arch):
            raise CudaError(f"--cuda-arch {text!r}: {part!r} is not an architecture like 90 or 8.9")
        archs.append(arch)
    if not archs:
        raise CudaError(f"--cuda-arch {text!r} names no architecture")
    return archs


def choose_archs(given: str | None = None) -> tuple[list[str], str]:
    """The architectures to compile for and why: `given`, else the visible GPUs', else the
    defaults this nvcc supports."""
    if given:
        return parse_archs(given), "--cuda-arch"
    seen = visible_archs()
    if seen:
        return seen, "the GPUs nvidia-smi lists"
    supported = set(nvcc_archs())
    archs = [a for a in DEFAULT_ARCHS if a in supported] if supported else list(DEFAULT_ARCHS)
    if not archs:
        raise CudaError(
            f"this nvcc supports none of the default architectures {';'.join(DEFAULT_ARCHS)}: "
            "name one with --cuda-arch"
        )
    return archs, f"no GPU in sight: the defaults {';'.join(DEFAULT_ARCHS)} this nvcc supports"


def toolkit_root() -> Path:
    return nvcc().resolve().parent.parent


def _toolkit_dirs(sub: str) -> list[Path]:
    root = toolkit_root()
    return [root / sub, *sorted(root.glob(f"targets/*/{sub}"))]


def toolkit_has_cublas() -> bool:
    return any((d / "cublas_v2.h").is_file() for d in _toolkit_dirs("include"))


def toolkit_has_driver_stub() -> bool:
    """Whether the toolkit ships libcuda.so's link stub (CMake's CUDA::cuda_driver needs it)."""
    return any(
        (d / "stubs" / "libcuda.so").is_file()
        for sub in ("lib64", "lib")
        for d in _toolkit_dirs(sub)
    )


@dataclass
class Cublas:
    include: Path
    cublas: Path
    cublas_lt: Path


def cublas_wheel_spec(major: int) -> str:
    """The PyPI project of cuBLAS for CUDA `major` (CUDA 13 renamed it)."""
    return f"nvidia-cublas=={major}.*" if major >= 13 else f"nvidia-cublas-cu{major}"


def find_cublas(root: Path) -> Cublas | None:
    """cuBLAS in an installed nvidia-cublas wheel under `root`: its wheels name the library
    files by version only (libcublas.so.13, no libcublas.so), so CMake is given the files."""
    for header in sorted(root.glob("nvidia/*/include/cublas_v2.h")):
        lib = header.parent.parent / "lib"
        cublas = sorted(lib.glob("libcublas.so.*"))
        cublas_lt = sorted(lib.glob("libcublasLt.so.*"))
        if cublas and cublas_lt:
            return Cublas(header.parent, cublas[0], cublas_lt[0])
    return None


def fetch_cublas(major: int, log: bool = True) -> Cublas:
    """cuBLAS from an nvidia-cublas wheel: one already installed in this environment (PyTorch
    brings one), else installed once into cache_dir()/cublas-cuMAJOR."""
    for site in dict.fromkeys(Path(p) for p in sys.path if p):
        found = find_cublas(site)
        if found and found.cublas.name.endswith(f".so.{major}"):
            return found
    target = cache_dir() / f"cublas-cu{major}"
    found = find_cublas(target)
    if found:
        return found
    spec = cublas_wheel_spec(major)
    if log:
        print(
            f"cuda: the toolkit has no cuBLAS; installing {spec} from PyPI into {target} "
            "(once, about 450 MB)",
            file=sys.stderr,
            flush=True,
        )
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), spec]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = find_cublas(target) if done.returncode == 0 else None
    if found is None:
        raise CudaError(
            f"the toolkit at {toolkit_root()} has no cuBLAS (cublas_v2.h) and `pip install "
            f"{spec}` did not provide it ({(done.stderr or done.stdout).strip()[-300:]}); "
            "install cuBLAS with the toolkit (the libcublas-dev package) and build again"
        )
    return found


@dataclass
class CudaFlags:
    """What a CUDA build adds: CMake flags, and flags for the C and C++ compilers (given
    through CFLAGS/CXXFLAGS: a -DCMAKE_C_FLAGS would replace the fix header those carry)."""

    cmake: list[str]
    c_flags: str


def build_flags(archs: list[str]) -> CudaFlags:
    """The flags of a CUDA build for `archs` on this machine."""
    cmake = ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}"]
    c_flags = ""
    if not toolkit_has_driver_stub():
        # No libcuda.so to link: ggml then allocates its pool plainly instead of through the
        # driver's virtual memory calls, and links no driver library at build time.
        cmake.append("-DGGML_CUDA_NO_VMM=ON")
    if not toolkit_has_cublas():
        cublas = fetch_cublas(nvcc_version()[0])
        cmake += [
            f"-DCUDA_cublas_LIBRARY={cublas.cublas}",
            f"-DCUDA_cublasLt_LIBRARY={cublas.cublas_lt}",
            f"-DCMAKE_CUDA_FLAGS=-I{cublas.include}",
        ]
        c_flags = f"-I{cublas.include}"
    return CudaFlags(cmake, c_flags)


def runtime_lib_dirs() -> list[Path]:
    """Directories holding the CUDA libraries a CUDA build loads (cuBLAS, the runtime) when
    the system's loader may not know them: the nvidia-* wheels in this environment, the
    cached cuBLAS, and the toolkit's lib64."""
    dirs: list[Path] = []
    for base in {Path(p) for p in sys.path if p}:
        dirs += sorted(p.parent for p in base.glob("nvidia/*/lib/libcu*.so.*"))
    for sub in sorted(cache_dir().glob("cublas-cu*")):
        found = find_cublas(sub)
        if found:
            dirs.append(found.cublas.parent)
    with contextlib.suppress(CudaError):
        dirs += [d for d in _toolkit_dirs("lib64") if d.is_dir()]
    return list(dict.fromkeys(dirs))


#: The CUDA libraries a CUDA build of ggml links by name, in the order they need each other.
_RUNTIME_SONAME = re.compile(rb"lib(?:cudart|cublasLt|cublas)\.so\.\d+")
_RUNTIME_ORDER = ("libcudart", "libcublasLt", "libcublas.")


def needed_runtime(library: Path) -> list[str]:
    """The CUDA runtime and cuBLAS sonames `library` links (read from its dynamic string
    table, which sits near the start of the file), in loading order."""
    try:
        with library.open("rb") as f:
            head = f.read(8 << 20)
    except OSError:
        return []
    names = {m.decode() for m in _RUNTIME_SONAME.findall(head)}
    return sorted(
        names, key=lambda n: next(i for i, p in enumerate(_RUNTIME_ORDER) if n.startswith(p))
    )


def preload_runtime(lib_dir: Path) -> list[str]:
    """Load the CUDA libraries a CUDA build in `lib_dir` needs from where the system's loader
    does not look (an nvidia-* wheel, the cuBLAS cache, the toolkit), before llama_cpp loads
    it: the loader then takes the ones already loaded. Returns the paths loaded this way;
    nothing for a build without CUDA, or where the system finds them itself."""
    import ctypes

    cuda_libs = sorted(lib_dir.glob("libggml-cuda*.so*")) if lib_dir.is_dir() else []
    if not cuda_libs:
        return []
    loaded: list[str] = []
    dirs: list[Path] | None = None
    for soname in needed_runtime(cuda_libs[0]):
        try:
            ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
            continue
        except OSError:
            pass
        dirs = runtime_lib_dirs() if dirs is None else dirs
        for d in dirs:
            if (d / soname).is_file():
                ctypes.CDLL(str(d / soname), mode=ctypes.RTLD_GLOBAL)
                loaded.append(str(d / soname))
                break
    return loaded


# -- what a build was compiled for -----------------------------------------------------

#: A fatbinary's header (magic, version, header size, size of its entries) and its entries'
#: (kind: 1 PTX, 2 machine code; header size, payload size; the architecture at byte 28).
_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_FATBIN_HEADER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ")
_ENTRY_ARCH_AT = 28


def built_archs(library: Path) -> list[str]:
    """The architectures a CUDA library holds code for, read from the entries of its
    fatbinaries: "sm_90" for machine code, "compute_90" for PTX only (compiled by the
    driver at load). Empty when the file holds none, or cannot be read."""
    try:
        data = library.read_bytes()
    except OSError:
        return []
    real: set[int] = set()
    ptx: set[int] = set()
    at = data.find(_FATBIN_MAGIC)
    while at != -1 and at + _FATBIN_HEADER.size <= len(data):
        _, version, header_size, size = _FATBIN_HEADER.unpack_from(data, at)
        if version == 1 and header_size == _FATBIN_HEADER.size:
            entry, end = at + header_size, min(at + header_size + size, len(data))
            while entry + _ENTRY_ARCH_AT + 4 <= end:
                kind, _, entry_header, payload = _ENTRY.unpack_from(data, entry)
                if entry_header < _ENTRY_ARCH_AT + 4:
                    break
                (arch,) = struct.unpack_from("<I", data, entry + _ENTRY_ARCH_AT)
                (real if kind == 2 else ptx).add(arch)
                entry += entry_header + payload
        at = data.find(_FATBIN_MAGIC, at + 4)
    return [f"sm_{a}" for a in sorted(real)] + [f"compute_{a}" for a in sorted(ptx - real)]


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in ("cmake-args", "c-flags", "archs") or len(argv) > 2:
        print(
            "usage: python -m app.toolchain.cuda cmake-args|c-flags|archs [ARCH]", file=sys.stderr
        )
        return 2
    try:
        archs, why = choose_archs(argv[1] if len(argv) == 2 else None)
        if argv[0] == "archs":
            print(f"{';'.join(archs)} ({why})")
        elif argv[0] == "cmake-args":
            print(" ".join(build_flags(archs).cmake))
        else:
            print(build_flags(archs).c_flags)
    except CudaError as exc:
        print(f"cuda: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
