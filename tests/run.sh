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

# llama-cpp-python ships only as source and compiles llama.cpp (minutes): built once per
# machine into a wheelhouse, with the fix that makes its AMX kernels sound (packaging/).
WHEELS=$(bash packaging/llama_wheel.sh "$VENV/bin/python")
"$VENV/bin/python" -m pip install -q --find-links "$WHEELS" '.[test]'

"$VENV/bin/python" -m ruff check app tests bench
exec "$VENV/bin/python" -m pytest -ra "$@"
