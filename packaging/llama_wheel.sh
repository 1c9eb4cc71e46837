#!/usr/bin/env bash
# Prints a wheelhouse that holds llama-cpp-python's wheel, built once per machine with
# app/toolchain/amx_tilecfg.h ahead of every source (ggml's AMX kernels are sound under GCC 12
# then; see that file) and without the parts batchyard never loads. pip prefers a wheel found
# with --find-links to the index's source package, so
# `pip install --find-links "$(bash packaging/llama_wheel.sh PYTHON)" .` uses it. The one home
# of this build: install.sh (the README's install), tests/run.sh and the packaging tests all
# take their wheel from here, so a machine compiles it once whichever comes first.
# Usage: bash packaging/llama_wheel.sh PYTHON [--cuda ARCH] [--no-build]
#   --no-build: print the wheelhouse and exit 1 when it holds no wheel yet, instead of building.
#   PYTHON: the python whose pip builds the wheel. --cuda ARCH builds the CUDA wheel for the
#   architectures ARCH ("90", "80;89;90"; "auto": what `batchyard engine build --cuda` picks),
#   with the flags app/toolchain/cuda.py gives (cuBLAS from the nvidia-cublas wheel where the
#   toolkit has none); it needs nvcc and takes about an hour on 2 cores for one architecture.
# BATCHYARD_WHEELHOUSE: where wheelhouses live (default ~/.cache/batchyard/wheels); each is
# named after a hash of everything that shapes the build (the flags below, the files they
# name, and CFLAGS, CXXFLAGS and CMAKE_ARGS from the environment), so a change to any of
# them builds anew and a stale wheel is never reused. Build output goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$1
shift
CUDA_ARCH=""
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) CUDA_ARCH=${2:?--cuda needs an architecture, like 90 or auto}; shift ;;
    --no-build) BUILD=0 ;;
    *) echo "llama_wheel.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
# The one copy of the fix header: `batchyard engine build` uses it from the installed package.
FIX=app/toolchain/amx_tilecfg.h
COMMON_OFF=packaging/llama_common_off.cmake
# libllama, ggml and libmtmd (the multimodal library: images in batch lines), and no llama.cpp
# common library (see $COMMON_OFF).
CMAKE_FLAGS="-DCMAKE_PROJECT_llama_cpp_INCLUDE=$PWD/$COMMON_OFF"
C_FLAGS="-include $PWD/$FIX"
KEY_CUDA=""
if [ -n "$CUDA_ARCH" ]; then
  [ "$CUDA_ARCH" = auto ] && CUDA_ARCH=""
  CUDA_CMAKE=$("$PY" -m app.toolchain.cuda cmake-args $CUDA_ARCH)
  CUDA_C=$("$PY" -m app.toolchain.cuda c-flags $CUDA_ARCH)
  CMAKE_FLAGS="$CMAKE_FLAGS $CUDA_CMAKE"
  C_FLAGS="$C_FLAGS $CUDA_C"
  # The cuBLAS cache's place is this machine's; the flags and the nvcc version are the build's.
  CUDA_CACHE=$("$PY" -c 'from app.toolchain.cuda import cache_dir; print(cache_dir())')
  KEY_CUDA="cuda ${CUDA_CMAKE//"$CUDA_CACHE"/} $(nvcc --version | tail -1)"
fi

# Paths go into the hash as written here, not absolute, so every checkout shares the wheel.
# The header goes in by its content (below); its flag is keyed by the path it had before it
# moved into the package, so wheelhouses built before the move stay valid.
KEY_C_FLAGS="-include packaging/amx_tilecfg.h"
KEY_CMAKE_FLAGS="-DCMAKE_PROJECT_llama_cpp_INCLUDE=$COMMON_OFF"
# A CPU build's key is what it was before CUDA builds came (their wheelhouses stay valid).
KEY=$(printf '%s\n' "$VERSION" "$KEY_CMAKE_FLAGS" "$KEY_C_FLAGS" ${KEY_CUDA:+"$KEY_CUDA"} \
  "CFLAGS=${CFLAGS:-}" "CXXFLAGS=${CXXFLAGS:-}" "CMAKE_ARGS=${CMAKE_ARGS:-}" |
  cat - "$FIX" "$COMMON_OFF" | sha256sum | cut -c1-12)
WHEELS="${BATCHYARD_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchyard/wheels}/$KEY"
if ! ls "$WHEELS/llama_cpp_python-$VERSION-"*.whl >/dev/null 2>&1; then
  if [ "$BUILD" = 0 ]; then
    echo "$WHEELS"
    exit 1
  fi
  echo "building llama-cpp-python $VERSION into $WHEELS (once; several minutes)" >&2
  CFLAGS="${CFLAGS:-} $C_FLAGS" CXXFLAGS="${CXXFLAGS:-} $C_FLAGS" \
    CMAKE_ARGS="${CMAKE_ARGS:-} $CMAKE_FLAGS" \
    "$PY" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -w "$WHEELS" >&2
fi
echo "$WHEELS"
