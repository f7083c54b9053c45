#!/usr/bin/env bash
# The main job on a fresh machine: make (or reuse) .venv, install lazybatch with plots, and run the default
# simulation (the paper's three models under every policy) that prints the comparison table and writes
# CSV/JSON/plots to ./lazybatch-results/.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LAZYBATCH_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[plots,serve]"
exec "$VENV/bin/lazybatch" simulate --out lazybatch-results "$@"
