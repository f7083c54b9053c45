"""Does the whole-graph session run slower beside the stage sessions? A diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_sibling_sessions --model-dir lazybatch-results/default/repos/bert/bert_eager/1 \\
        --json lazybatch-results/sibling_sessions_bert.json

Eager's stub holds the model twice: the stage sessions (one per stage, for the passes that keep boundaries) and the
whole graph (the passes that span every stage). Triton 0 ms's stub holds the whole graph only. On BERT (436 MB of
weights) eager's whole-graph passes were a few percent slower than Triton 0 ms's in the same server (batch logs in
git: ``git show 8443b73:docs/data/regimes_bert_eager_vs_triton0_batches/``), so the question was whether the siblings slow it: more memory
mapped, caches shared with weights that sit idle. In one process with one thread pool (as in a stub), this times
the whole-graph session at batch 1, 4 and 8 alone, then with every stage session loaded and run once at the largest
batch (their arenas sized as a served model's), then alone again after they are freed; ``--rounds`` times over, so
that the machine's drift lands on both alike. Per batch size: the median over the rounds of each condition's
median run, and their ratio (with stages / alone).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.harness import command_line, machine_meta, write_json
from tqdm import tqdm

from lazybatch.backend.fusion import fused_manifest
from lazybatch.backend.stages import StageRunner
from lazybatch.formats.stage_manifest import load_manifest
from lazybatch.sessions.threads import use_global_thread_pool


def timed(whole: StageRunner, samples: dict, runs: int) -> dict[int, float]:
    """The median of ``runs`` whole-graph runs per batch size (ms), after one untimed run."""
    out = {}
    for b, feeds in samples.items():
        whole.run(0, feeds)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            whole.run(0, feeds)
            times.append(time.perf_counter() - t0)
        out[b] = statistics.median(times) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="a served model's version folder: model.onnx and stages/ "
                    "(e.g. the eager model of a repository that bench_default.py or bench_regimes.py built)")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=30, help="timed runs per batch size and condition")
    ap.add_argument("--json", default=None, help="also write the figures here (raw data for the docs)")
    args = ap.parse_args(argv)
    d = Path(args.model_dir)
    stages, whole_path = d / "stages", d / "model.onnx"
    if not (stages / "manifest.json").exists() or not whole_path.exists():
        ap.error(f"--model-dir {d} needs model.onnx and stages/manifest.json (a lazybatch repository's version "
                 "folder, e.g. lazybatch-results/default/repos/bert/bert_eager/1)")
    use_global_thread_pool(0)  # as in a stub (backend/model.py)
    manifest = load_manifest(stages)
    whole = StageRunner(stages, manifest=fused_manifest(manifest, whole_path), inplace_residuals=False)
    batches = [int(b) for b in args.batches.split(",")]
    samples = {b: whole.sample_inputs(b, seed=1) for b in batches}
    rounds: dict[str, list[dict[int, float]]] = {"alone": [], "with_stages": [], "alone_after": []}
    for _ in tqdm(range(args.rounds), desc=d.parent.name, unit="round"):
        rounds["alone"].append(timed(whole, samples, args.runs))
        runner = StageRunner(stages)
        runner.run_all(runner.sample_inputs(max(batches)))
        rounds["with_stages"].append(timed(whole, samples, args.runs))
        del runner
        gc.collect()
        rounds["alone_after"].append(timed(whole, samples, args.runs))
    summary = {}
    for b in batches:
        med = {c: statistics.median(r[b] for r in rs) for c, rs in rounds.items()}
        alone = statistics.median([r[b] for r in rounds["alone"] + rounds["alone_after"]])
        summary[b] = {**{f"{c}_ms": v for c, v in med.items()}, "with_stages_over_alone": med["with_stages"] / alone}
        print(f"batch {b}: whole graph alone {alone:.2f} ms, beside the {len(manifest.stages)} stage sessions "
              f"{med['with_stages']:.2f} ms ({summary[b]['with_stages_over_alone']:.3f}x); per round: "
              + ", ".join(f"{c} {[round(r[b], 2) for r in rs]}" for c, rs in rounds.items()))
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line()}, "model_dir": str(d),
                               "stages": len(manifest.stages), "runs": args.runs, "rounds": rounds,
                               "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
