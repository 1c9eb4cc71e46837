#!/usr/bin/env bash
# The test command: installs everything the tests need, then runs them all.
# Usage: bash tests/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${BATCHYARD_TEST_VENV:-.venv}

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads one).
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip

# llama-cpp-python ships only as source and compiles llama.cpp (minutes). Build its wheel
# once per machine with packaging/amx_tilecfg.h ahead of every source, which makes ggml's AMX
# kernels sound under GCC 12 (see that file), and keep it in a wheelhouse named after that
# header; pip prefers the wheel found there to the source package on the index.
LLAMA_VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
FIX="$PWD/packaging/amx_tilecfg.h"
WHEELS="${BATCHYARD_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchyard/wheels}/$(sha256sum "$FIX" | cut -c1-12)"
if ! ls "$WHEELS/llama_cpp_python-$LLAMA_VERSION-"*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION into $WHEELS (once; several minutes)"
  CFLAGS="${CFLAGS:-} -include $FIX" CXXFLAGS="${CXXFLAGS:-} -include $FIX" \
    "$VENV/bin/python" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
fi
"$VENV/bin/python" -m pip install -q --find-links "$WHEELS" '.[test]'

"$VENV/bin/python" -m ruff check app tests bench
exec "$VENV/bin/python" -m pytest -ra "$@"
