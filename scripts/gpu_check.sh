#!/usr/bin/env bash
# GPU check: lazybatch's stage path on onnxruntime's CUDA provider, on a machine with onnxruntime-gpu.
#
#   scripts/gpu_check.sh [OUT_DIR] [MODEL]      (default: gpu-check/, resnet50)
#
# Exports MODEL from the zoo (seeded weights), splits it into stages and verifies the chain against the whole graph,
# runs the backend's StageRunner with execution_provider=cuda and checks its answers against onnxruntime's CPU
# provider on the whole graph, profiles every stage on CUDA and on the CPU (the latency tables the scheduler reads),
# and replays the default policy against Triton's batcher (graph:0) on the CUDA table in the simulator. Everything
# lands in OUT_DIR (tables, verify report, check.json). Exits non-zero where CUDA is missing or an answer differs.
set -euo pipefail
OUT="${1:-gpu-check}"; MODEL="${2:-resnet50}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"; W="$(mktemp -d)"
LB=("$PY" -m lazybatch)
"$PY" - <<'PY'
import onnxruntime as ort
have = ort.get_available_providers()
print("onnxruntime", ort.__version__, have, flush=True)
if "CUDAExecutionProvider" not in have:
    raise SystemExit("no CUDAExecutionProvider: install onnxruntime-gpu (and the CUDA/cuDNN libraries it needs)")
PY
"${LB[@]}" export "$MODEL" --out "$W/m.onnx"
"${LB[@]}" split "$W/m.onnx" --out "$W/stages" --verify
"${LB[@]}" profile "$W/stages" --provider CUDAExecutionProvider --batch-sizes 1,2,4,8,16,32,64 --warmup 5 \
    --repeat 15 --out "$OUT/table_cuda.json" --no-plot
"${LB[@]}" profile "$W/stages" --provider CPUExecutionProvider --batch-sizes 1,16 --repeat 3 \
    --out "$OUT/table_cpu.json" --no-plot
"$PY" - "$W/stages" "$OUT" <<'PY'
import json, sys, time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.latency_table import LatencyTable

stages, out = Path(sys.argv[1]), Path(sys.argv[2])
gpu = StageRunner(stages, execution_provider="cuda")
assert gpu.providers[0] == "CUDAExecutionProvider", gpu.providers
on_gpu = {s.get_providers()[0] for s in gpu.sessions}
manifest = json.loads((stages / "manifest.json").read_text())
cpu_whole = ort.InferenceSession(str(stages / manifest["whole_model"]), providers=["CPUExecutionProvider"])
worst = 0.0
for b in (1, 3, 8):
    x = gpu.sample_inputs(b, seed=b)
    got = gpu.run_all(x)
    ref = dict(zip([o.name for o in cpu_whole.get_outputs()], cpu_whole.run(None, x)))
    for name, v in got.items():
        err = float(np.max(np.abs(v - ref[name])) / (np.max(np.abs(ref[name])) + 1e-12))
        worst = max(worst, err)
print(f"CUDA stage chain vs CPU whole graph: worst relative error {worst:.2e}; sessions on {sorted(on_gpu)}")
cuda, cpu = LatencyTable.load(out / "table_cuda.json"), LatencyTable.load(out / "table_cpu.json")
rows = []
for s in range(cuda.graph.n):
    rows.append({"stage": cuda.graph.stages[s].name,
                 "cuda_ms": {b: round(cuda.latency(s, b) * 1e3, 4) for b in (1, 8, 32, 64)},
                 "cpu_ms": {b: round(cpu.latency(s, b) * 1e3, 4) for b in (1, 16)}})
t1c = sum(cuda.latency(s, 1) for s in range(cuda.graph.n))
t1p = sum(cpu.latency(s, 1) for s in range(cpu.graph.n))
print(f"t1 (sum of stages at batch 1): CUDA {t1c*1e3:.3f} ms, CPU {t1p*1e3:.3f} ms")
for r in rows:
    print(f"  {r['stage']:>14}  cuda b1/8/32/64 ms {list(r['cuda_ms'].values())}  cpu b1/16 ms {list(r['cpu_ms'].values())}")
ok = bool(worst < 1e-2) and on_gpu == {"CUDAExecutionProvider"}  # TF32, onnxruntime's CUDA default, against fp32 on the CPU
(out / "check.json").write_text(json.dumps({"onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
    "worst_rel_err": worst, "sessions_on": sorted(on_gpu), "t1_cuda_ms": t1c * 1e3, "t1_cpu_ms": t1p * 1e3,
    "stages": rows, "ok": ok}, indent=1))
raise SystemExit(0 if ok else f"FAILED: worst relative error {worst:.2e}, sessions on {sorted(on_gpu)}")
PY
"$PY" "$(dirname "$0")/gpu_stage_copies.py" "$W/stages" --out "$OUT/copies.json"
# The scheduler on the CUDA table: the default against Triton's batcher with no queue delay, at 10-120% of t1's rate
T1=$("$PY" -c "import json;print(json.load(open('$OUT/check.json'))['t1_cuda_ms'])")
RATES=$("$PY" -c "r=1000/$T1; print(','.join(f'{r*f:.0f}' for f in (0.1,0.7,1.2,3.0)))")
"${LB[@]}" simulate --model "$OUT/table_cuda.json" --policy eager --policy graph:0 --rate "$RATES" \
    --sla-ms 100 --seeds 2 --requests 1000 --out "$OUT/sim" --no-plots | tee "$OUT/simulate.txt"
echo "GPU check passed: $OUT"
