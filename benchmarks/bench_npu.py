"""NPU timing model vs SCALE-Sim 3.0.0 on ResNet-50 (224x224) convolution layers.

    pip install -e '.[npu-validate]'                 # scalesim==3.0.0
    python -m benchmarks.bench_npu                   # both dataflows, all 23 distinct layer shapes (~5 min)
    python -m benchmarks.bench_npu --dataflow ws --limit 5

Same array (128x128), SRAM sizes (Table I) and dataflow in both. Prints, per distinct layer shape: our compute
cycles, SCALE-Sim's, the error, the wall time of one latency query (one layer, one batch size) and of SCALE-Sim's
run of that layer, and their ratio; then the network totals (each shape weighted by its occurrences among the 53
convolutions). Goals (docs/npu.md): |error| <= 5% per layer and <= 2% over the network; query time <= 1/1000 of
SCALE-Sim's.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import command_line, machine_meta
from benchmarks.harness.verdict import MET, judge_value
from lazybatch.npu_model import NPUConfig
from lazybatch.npu_model.scalesim_ref import conv_layers, unique_layers
from lazybatch.npu_model.validate import as_rows, check_layers, markdown, summarize


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="ResNet-50 ONNX file (default: `lazybatch export resnet50` into a temp dir)")
    ap.add_argument("--dataflow", default="os,ws", help="comma-separated: os, ws")
    ap.add_argument("--limit", type=int, default=0, help="only the first N distinct layer shapes")
    ap.add_argument("--json", type=Path, help="write the rows and the summary here")
    args = ap.parse_args(argv)
    cfg = NPUConfig()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            from lazybatch.onnx_tools.zoo import export_model

            model = str(Path(tmp) / "resnet50.onnx")
            export_model("resnet50", Path(model))
        layers = unique_layers(conv_layers(model))
    if args.limit:
        layers = layers[: args.limit]
    dfs = [d.strip() for d in args.dataflow.split(",") if d.strip()]
    checks = check_layers(layers, cfg, dfs)
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}; array "
          f"{cfg.rows}x{cfg.cols}, ifmap/ofmap SRAM {cfg.act_sram_bytes // 2048} KiB each, filter SRAM "
          f"{cfg.wgt_sram_bytes // 1024} KiB")
    print(markdown(checks))
    summary = summarize(checks)
    print()
    for df, s in summary.items():
        print(f"{df}: {s['layers']} shapes / {s['network_layers']} layers; worst layer error "
              f"{s['worst_layer_error_pct']:.3f}% (goal 5%), network error {s['network_error_pct']:+.4f}% (goal 2%), "
              f"query/SCALE-Sim time: worst 1/{1 / s['worst_time_ratio']:,.0f}, median "
              f"1/{1 / s['median_time_ratio']:,.0f} (goal 1/1000); SCALE-Sim took {s['scalesim_seconds']:.0f} s")
    # deterministic cycle counts, one figure each (no spread): the one rule on [x, x]
    ok = all(judge_value(x, goal, lower_is_better=True) == MET for s in summary.values()
             for x, goal in ((s["worst_layer_error_pct"], 5), (abs(s["network_error_pct"]), 2),
                             (s["worst_time_ratio"], 1e-3)))
    if args.json:
        meta = {**machine_meta(), "command": command_line()}  # the commit and machine the figures are from
        args.json.write_text(json.dumps({"meta": meta, "rows": as_rows(checks), "summary": summary}, indent=1) + "\n")
    print("all goals met" if ok else "GOALS NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
