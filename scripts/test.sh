#!/usr/bin/env bash
# The test command: make (or reuse) .venv, install lazybatch with its test extra, run the whole suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k lazy -x
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LAZYBATCH_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test,serve]"
exec "$VENV/bin/python" -m pytest "$@"
