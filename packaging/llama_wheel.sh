#!/usr/bin/env bash
# Prints a wheelhouse that holds llama-cpp-python's wheel, built once per machine with
# packaging/amx_tilecfg.h ahead of every source (ggml's AMX kernels are sound under GCC 12
# then; see that file). pip prefers a wheel found with --find-links to the index's source
# package, so `pip install --find-links "$(bash packaging/llama_wheel.sh PYTHON)" .` uses it.
# Usage: bash packaging/llama_wheel.sh PYTHON     (the python whose pip builds the wheel)
# BATCHYARD_WHEELHOUSE: where wheelhouses live (default ~/.cache/batchyard/wheels); each is
# named after the header, so changing the header builds anew. Build output goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$1
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
FIX="$PWD/packaging/amx_tilecfg.h"
WHEELS="${BATCHYARD_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchyard/wheels}/$(sha256sum "$FIX" | cut -c1-12)"
if ! ls "$WHEELS/llama_cpp_python-$VERSION-"*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $VERSION into $WHEELS (once; several minutes)" >&2
  CFLAGS="${CFLAGS:-} -include $FIX" CXXFLAGS="${CXXFLAGS:-} -include $FIX" \
    "$PY" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -w "$WHEELS" >&2
fi
echo "$WHEELS"
