#!/usr/bin/env bash
# The prepared GPU check, as one device call (docs/deploy.md, "The GPU check"):
#
#   scripts/gpu_check.sh OUT --commit SHA     on a lent GPU, once scripts/gpu_carry.py's parts have arrived
#   scripts/gpu_check.sh OUT --cpu            the rehearsal: the same phases on the CPU provider (tests run it)
#
# On the GPU it reassembles and installs the carried onnxruntime-gpu wheel into /tmp/site (first on PYTHONPATH: the
# machine's own onnxruntime is CPU-only), then runs benchmarks/gpu_check.py under a hard timeout, so the call ends
# inside its lease; every phase's results are in OUT/check.json as soon as the phase ends.
set -uo pipefail
OUT="${1:?usage: scripts/gpu_check.sh OUT (--commit SHA | --cpu) [benchmarks.gpu_check options]}"; shift
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT"
if [[ " $* " != *" --cpu "* ]]; then
    "$PY" scripts/gpu_carry.py install --target /tmp/site || exit 3
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONUNBUFFERED=1 timeout "${GPU_CHECK_TIMEOUT_S:-235}" "$PY" -m benchmarks.gpu_check "$OUT" "$@"
