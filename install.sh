#!/usr/bin/env bash
# Installs batchyard from this checkout with the fast llama.cpp build, in one compile:
# packaging/llama_wheel.sh builds llama-cpp-python once per machine, with the CPU's own
# flags and app/toolchain/amx_tilecfg.h ahead of every source (GCC 12 otherwise miscompiles
# ggml's AMX kernels and the server runs on plain buffers, several times slower), into a
# wheelhouse keyed by those flags; this then installs the package with pip taking
# llama-cpp-python from that wheelhouse only. A machine that holds the wheel already (an
# earlier install, or tests/run.sh, which builds the same one) compiles nothing.
#
# Usage: bash install.sh [--venv DIR]
#   (default)   `pipx install` (batchyard on pipx's PATH: `batchyard serve`)
#   --venv DIR  a plain venv at DIR, made if missing (`DIR/bin/batchyard serve`)
# PYTHON: the python that builds the wheel and makes the venv (default python3).
# BATCHYARD_WHEELHOUSE: where the wheelhouses live (packaging/llama_wheel.sh).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=""
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) VENV=${2:?--venv needs a directory}; shift ;;
    -h|--help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (usage: bash install.sh [--venv DIR])" >&2; exit 2 ;;
  esac
  shift
done

PIPX=()
if [ -z "$VENV" ]; then
  if command -v pipx >/dev/null; then
    PIPX=(pipx)
  elif "$PY" -m pipx --version >/dev/null 2>&1; then
    PIPX=("$PY" -m pipx)
  else
    echo "install.sh: no pipx. Install it (Debian: \`sudo apt install pipx\`; elsewhere" \
      "\`$PY -m pip install --user pipx\`), or install into a venv instead:" \
      "\`bash install.sh --venv ~/.batchyard\`." >&2
    exit 1
  fi
fi

t0=$SECONDS
WH=$(bash packaging/llama_wheel.sh "$PY")
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
WHEEL=$(ls "$WH/llama_cpp_python-$VERSION-"*.whl | tail -n 1)
echo "install.sh: llama-cpp-python $VERSION: $WHEEL" >&2

# llama-cpp-python from the wheelhouse only: the index has nothing but its source, which pip
# would compile without the fix (or take the stock wheel its cache kept from an earlier build:
# that cache knows a built source package by its URL, not by the flags it was built with).
PIP_ARGS=(--find-links "$WH" --only-binary llama-cpp-python)
if [ -n "$VENV" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # In place of any build of the same version an earlier install left (pip keeps it otherwise).
  "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$WHEEL"
  "$VENV/bin/python" -m pip install -q "${PIP_ARGS[@]}" .
  BIN=$(cd "$VENV/bin" && pwd)/batchyard
else
  # --force: over an earlier install too, where pipx has pip reinstall every package, so
  # the wheel replaces any other build of that version the environment holds.
  "${PIPX[@]}" install --force . --pip-args "--find-links '$WH' --only-binary llama-cpp-python"
  BIN=batchyard
fi
echo "install.sh: installed in $((SECONDS - t0)) s; start it with \`$BIN serve\`" >&2
