#!/usr/bin/env bash
# Prints a directory holding llama.cpp's own `llama-server` and `llama-batched-bench`, built
# once per machine from the llama.cpp sources vendored in the pinned llama-cpp-python sdist,
# with app/toolchain/amx_tilecfg.h ahead of every source (the same fix as batchyard's wheel, so
# both sides run the same kernels). bench/throughput.py runs them as batchyard's baseline.
# Usage: bash bench/build_llama_server.sh [PYTHON] [--no-build]
#   PYTHON: the python whose pip downloads the sdist. --no-build: print the binary dir and exit
#   1 when nothing is built there yet, instead of building (a test that needs llama-server
#   asks this way, so the suite never spends minutes compiling it).
# BATCHYARD_LLAMA_SERVER_CACHE: where builds live (default ~/.cache/batchyard/llama-server);
# each is named after a hash of the version, the flags and the header, so a change to any of
# them builds anew. Build output goes to stderr; the only line on stdout is the binary dir.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
BUILD=1
for arg in "$@"; do
  case "$arg" in
    --no-build) BUILD=0 ;;
    *) PY=$arg ;;
  esac
done
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
FIX=app/toolchain/amx_tilecfg.h
CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF ${CMAKE_ARGS:-}"
C_FLAGS="-include $PWD/$FIX"

# The header goes into the hash by its content; its flag is keyed by the path it had before it
# moved into the package (as packaging/llama_wheel.sh does), so earlier builds stay valid.
KEY_C_FLAGS="-include packaging/amx_tilecfg.h"
KEY=$(printf '%s\n' "$VERSION" "$CMAKE_FLAGS" "$KEY_C_FLAGS" \
  "CFLAGS=${CFLAGS:-}" "CXXFLAGS=${CXXFLAGS:-}" | cat - "$FIX" | sha256sum | cut -c1-12)
ROOT="${BATCHYARD_LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchyard/llama-server}/$KEY"
BIN="$ROOT/bin"
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-batched-bench" ]; then
  echo "$BIN"
  exit 0
fi
if [ "$BUILD" = 0 ]; then
  echo "$BIN"
  exit 1
fi

echo "building llama-server $VERSION into $ROOT (once; several minutes)" >&2
mkdir -p "$ROOT"
WORK=$(mktemp -d "$ROOT/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Only llama-cpp-python as source: with `--no-binary :all:` pip would also build the sdist's
# build requirements from source (CMake among them: many minutes on a fresh machine).
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" \
  -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC=$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)
# shellcheck disable=SC2086
CFLAGS="${CFLAGS:-} $C_FLAGS" CXXFLAGS="${CXXFLAGS:-} $C_FLAGS" \
  cmake -S "$SRC" -B "$WORK/build" -G Ninja $CMAKE_FLAGS >&2
cmake --build "$WORK/build" -j "$(nproc)" --target llama-server llama-batched-bench >&2
mkdir -p "$BIN.tmp"
cp "$WORK"/build/bin/llama-server "$WORK"/build/bin/llama-batched-bench "$BIN.tmp"/
rm -rf "$BIN"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
