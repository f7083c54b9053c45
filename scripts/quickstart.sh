#!/usr/bin/env bash
# The serving main job on a fresh machine: make (or reuse) .venv, install lazybatch with the serve extra (a real
# tritonserver from nvidia-pytriton, tritonclient), build the default model repository (ResNet-50 under
# LazyBatching, Triton's dynamic batcher at 0/5/20 ms and serial; weights are generated here), start the server
# (with an identical copy of Triton 0 ms from a second repository, the verdict's noise floor), run a short
# open-loop Poisson load against every model and print the comparison table. The server is stopped at
# the end. Then, on the same server, the co-located pair (benchmarks/pair.py): the 8 x 2048 MLP beside ResNet-50,
# both driven at once, under lazybatch's defaults (the CPU share on: the large model's threads yield the cores
# while the small one has requests) and under Triton's batcher at 0/5 ms and at 0 ms pinned a core each, each alone
# for reference, with an identical copy of Triton 0 ms as the noise floor and Triton 0 ms with the large stub at
# nice 10 by hand as a reference line; its table is printed after the first. Results: lazybatch-results/triton-quick/
# (bench.md, bench.json, bench.png, pair.md, pair.json, tritonserver.log). About 8-12 minutes on 2 cores.
#
# Longer, the full static-model experiment: .venv/bin/python -m benchmarks.bench_triton   (about 15 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LAZYBATCH_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[cpu,plots,serve]"
"$VENV/bin/lazybatch" repo default --pair
# --min-requests: the 10% cell runs until it expects 60 requests per configuration (5 s would hold about 20)
exec "$VENV/bin/python" -m benchmarks.bench_triton --duration 5 --min-requests 60 --fractions 0.1,0.7,1.2 --pair \
  --out lazybatch-results/triton-quick "$@"
