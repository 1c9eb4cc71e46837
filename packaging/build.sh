#!/usr/bin/env bash
# Build the single executable dist/batchyard with PyInstaller.
# Usage: bash packaging/build.sh [DIST_DIR]       (default: dist/)
# BATCHYARD_BUILD_VENV: the build's own venv (default: build/pyinstaller-venv); it gets the
# package with its dependencies (llama-cpp-python from packaging/llama_wheel.sh's wheelhouse)
# and PyInstaller.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
DIST=${1:-dist}
VENV=${BATCHYARD_BUILD_VENV:-build/pyinstaller-venv}
WORK=${BATCHYARD_BUILD_WORK:-build/pyinstaller}
PYINSTALLER_VERSION=${PYINSTALLER_VERSION:-6.22.3}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
WHEELS=$(bash packaging/llama_wheel.sh "$VENV/bin/python")
"$VENV/bin/python" -m pip install -q --find-links "$WHEELS" . "pyinstaller==$PYINSTALLER_VERSION"
"$VENV/bin/pyinstaller" packaging/batchyard.spec \
  --noconfirm --log-level WARN --distpath "$DIST" --workpath "$WORK"
ls -l "$DIST/batchyard"
