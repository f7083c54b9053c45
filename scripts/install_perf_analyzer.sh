#!/usr/bin/env bash
# Installs NVIDIA's perf_analyzer into the virtualenv for `lazybatch perf` (see docs/triton.md).
#
# The newest perf_analyzer package does not install on this kind of machine, but the tritonclient 2.41.0 wheel
# carries a working perf_analyzer binary (tritonclient-2.41.0.data/data/bin/). It needs libb64.so.0d and
# libcudart.so.12: both ship, under hashed names, in nvidia-pytriton's nvidia_pytriton.libs/ (the serve extra), and
# symlinks with the plain names are enough. The wheel is only unpacked: the venv's own tritonclient is not touched.
# The logic lives in lazybatch/perf.py (install); this script is its documented entry point.
#
# Usage: scripts/install_perf_analyzer.sh [VENV]   (default .venv) -> VENV/bin/perf_analyzer (a wrapper)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${LAZYBATCH_VENV:-.venv}}"
[ -x "$VENV/bin/python" ] || { echo "no virtualenv at $VENV (run scripts/test.sh or scripts/quickstart.sh)" >&2; exit 2; }
exec "$VENV/bin/python" -c 'from lazybatch.perf import install; print(f"installed {install()}")'
