#!/usr/bin/env bash
# The serving main job on a fresh machine: make (or reuse) .venv, install lazybatch with the serve extra (a real
# tritonserver from nvidia-pytriton, tritonclient), build the default model repository (weights generated here),
# start the server and answer two questions (benchmarks/quickstart.py):
#   1. is lazybatch's default level with Triton's dynamic batcher on a model alone? (the 8 x 2048 MLP at 40% and 70%
#      of its batch-1 rate, against Triton 0 ms and an identical copy of it, the noise floor)
#   2. what does a latency-critical model keep beside a busy neighbour at a load the machine sustains? (the ~1 ms
#      tiny model at 30% of its rate beside the MLP at 50%: lazybatch's defaults, Triton 0 ms, its copy, the hand-set
#      nice line, and tiny alone)
# Each phase's time and the total are printed. Results: lazybatch-results/quickstart/ (quickstart.md, quickstart.json,
# cdf.png: tiny's latency CDF, tritonserver.log). About 4 minutes on 2 cores from the server's start.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LAZYBATCH_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[cpu,plots,serve]"
"$VENV/bin/lazybatch" repo default --pair
echo "setup (venv, install, model repository): ${SECONDS} s"
"$VENV/bin/python" -m benchmarks.quickstart "$@"
echo "quickstart.sh: ${SECONDS} s in all, setup included"
