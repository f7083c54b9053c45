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
# tests/test_deploy.py validates docker-compose.yml with Debian's docker-compose (no Docker engine needed)
if ! command -v docker-compose >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing docker-compose (apt-get) for tests/test_deploy.py" >&2
        (apt-get install -y -q docker-compose >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q docker-compose >/dev/null 2>&1; }) ||
            echo "could not install docker-compose: tests/test_deploy.py will fail (apt-get install docker-compose)" >&2
    else
        echo "docker-compose is missing: tests/test_deploy.py will fail (apt-get install docker-compose)" >&2
    fi
fi
exec "$VENV/bin/python" -m pytest "$@"
