"""Where batching pays: every policy on a real tritonserver, per model, from light load to overload.

    python -m benchmarks.bench_regimes                       # MLP, BERT-base seq 32, ResNet-50, GNMT (~70 min)
    python -m benchmarks.bench_regimes --quick               # tiny MLP, two loads, ~2 min: a smoke test
    python -m benchmarks.bench_regimes --models mlp --loads 0.4,0.9 --duration 6

Per model, in one run: build its model directories under every policy (lazy, oracle, serial, Triton's dynamic
batcher at max_queue_delay 0/5/20 ms, BatchMonitor), profile its stages (the latency table the policies read) and
plot its batch-scaling curve next to ResNet-50's; start one tritonserver on that model's repository; measure the
batch-1 service time (median of sequential whole-graph requests; for seq2seq models, whose requests differ in
length, the mean of a fixed set of sequential requests served one at a time; service rate mu = 1/t1); then open-loop Poisson
load at each fraction of mu under every policy, driven by ``lazybatch load`` (client/load.py), and by
perf_analyzer (Poisson, --async) at the ``--perf-loads`` fractions. Each cell's request count is checked against
the server's own (Triton's /v2/models/<m>/stats); the backend's statistics (LAZYBATCH_STATS_DIR) give the mean
executed (sub-)batch, preemptions and merges. Output: ``--out`` (results.json, per-run logs) and the results page
``--page`` with its plots in ``--img-dir``; the page is written by this script alone (no hand edits).

SLA targets are multiples (``--sla-multiples``, default 2,5,10) of the model's single-request latency t1; the
SLA-aware policies (eager, lazy, oracle) receive the ``--sched-sla-multiple`` target (default 5x) with every
request, and every policy's violation rate is computed at each target from the same latencies. The default policy
(eager) is also judged against the best baseline with the spread over the slices, a cell's repetitions.

The machine's cores are shared with other jobs, so its load drifts: each load's time is cut into ``--slices`` and
the policies take turns slice by slice, so that the drift spreads over all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, machine_meta
from benchmarks.regimes.page import write_page
from benchmarks.regimes.policies import DESCRIPTION, KNOWN_POLICIES, NOT_SERVED, POLICY_ORDER, VARIANTS, Settings
from benchmarks.regimes.saved import load_results
from benchmarks.regimes.sweep import run


def parse_list(text: str, cast: Any = float) -> list:
    return [cast(v.strip()) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    from lazybatch.batcher.errors import ConfigError

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma list of mlp, bert, resnet50, gnmt, tiny "
                    "(default mlp,bert,resnet50,gnmt; --quick: tiny)")
    ap.add_argument("--loads", default=None, help="load fractions of the batch-1 service rate "
                    "(default 0.1,0.4,0.7,0.9,1.2,1.5; --quick: 0.3,0.9)")
    ap.add_argument("--overload-loads", default=None, help="further loads for models whose profile shows "
                    "batching pays (gain >= 2x), for their peak throughput (default 2,3; --quick and '': none)")
    ap.add_argument("--perf-loads", default=None, help="fractions driven by perf_analyzer too (default 0.4,0.9; "
                    "--quick: 0.9; '' for none)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of load per policy and load "
                    "(default 8; --quick: 2)")
    ap.add_argument("--seq2seq-duration", type=float, default=None, help="seconds per cell for seq2seq models "
                    "(default 30; --quick: 2)")
    ap.add_argument("--min-requests", type=int, default=None, help="stretch a light load's cell (up to twice "
                    "--duration) to about this many requests (default 16; --quick: 0)")
    ap.add_argument("--slices", type=int, default=None, help="policies take turns in this many slices per load "
                    "(default 3, the cell's repetitions; --quick: 1)")
    ap.add_argument("--perf-measurement-ms", type=int, default=None,
                    help="perf_analyzer window (-p), three windows per cell (default 2500; --quick: 1000)")
    ap.add_argument("--sla-multiples", default="2,5,10", help="SLA targets as multiples of t1")
    ap.add_argument("--sched-sla-multiple", type=float, default=5.0, help="the target eager/lazy/oracle schedule by")
    ap.add_argument("--policies", default=",".join(POLICY_ORDER),
                    help="subset of " + ",".join(POLICY_ORDER) + "; variants, asked for by name: "
                    + "; ".join(f"{k} ({v})" for k, v in VARIANTS.items()))
    ap.add_argument("--out", default=None, help="work and raw results (default lazybatch-results/regimes[-quick])")
    ap.add_argument("--page", default=None,
                    help="results page (default docs/results/regimes.md; --quick: OUT/regimes.md)")
    ap.add_argument("--img-dir", default=None, help="plots (default docs/img; --quick: OUT/img)")
    ap.add_argument("--data", default=None, help="copy of the raw results (default docs/data/regimes.json; "
                    "--quick: none)")
    ap.add_argument("--from-results", default=None, help="render the page again from a results.json, measure nothing; "
                    "A.json,B.json: B's models (a later run) join A's or replace A's results for the same model")
    ap.add_argument("--reuse-profile", action="store_true", help="keep latency tables from an earlier run in --out")
    ap.add_argument("--quiet-machine", action="store_true", help="say on the page that nothing else ran")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny model, two loads, short windows")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    q = args.quick
    try:
        models = parse_list(args.models or ("tiny" if q else "mlp,bert,resnet50,gnmt"), str)
        for m in models:
            if m not in DESCRIPTION:
                raise ConfigError(f"--models: unknown model {m!r}; choose from {', '.join(DESCRIPTION)}"
                                  + (f" ({NOT_SERVED[m]})" if m in NOT_SERVED else ""))
        policies = parse_list(args.policies, str)
        for p in policies:
            if p not in KNOWN_POLICIES:
                raise ConfigError(f"--policies: unknown policy {p!r}; choose from {', '.join(KNOWN_POLICIES)}")
        policies = [p for p in KNOWN_POLICIES if p in policies]
        loads = parse_list(args.loads or ("0.3,0.9" if q else "0.1,0.4,0.7,0.9,1.2,1.5"))
        perf_loads = parse_list(args.perf_loads if args.perf_loads is not None else ("0.9" if q else "0.4,0.9"))
        overload = parse_list(args.overload_loads if args.overload_loads is not None else ("" if q else "2,3"))
        if any(f <= 0 for f in loads + perf_loads + overload):
            raise ConfigError("--loads/--perf-loads/--overload-loads: fractions must be > 0")
    except ValueError as e:
        raise SystemExit(f"bench_regimes: error: {e}") from None
    except ConfigError as e:
        raise SystemExit(f"bench_regimes: error: {e}") from None
    out = Path(args.out or ("lazybatch-results/regimes-quick" if q else "lazybatch-results/regimes"))
    st = Settings(models=models, loads=loads, perf_loads=perf_loads,
                  duration=args.duration or (2.0 if q else 8.0),
                  min_requests=args.min_requests if args.min_requests is not None else (0 if q else 16),
                  slices=args.slices or (1 if q else 3),
                  perf_measurement_ms=args.perf_measurement_ms or (1000 if q else 2500),
                  sla_multiples=parse_list(args.sla_multiples), sched_sla_multiple=args.sched_sla_multiple,
                  policies=policies, out=out, seed=args.seed, reprofile=not args.reuse_profile,
                  seq2seq_duration=args.seq2seq_duration or (2.0 if q else 30.0), overload_loads=tuple(overload))
    page = Path(args.page or (out / "regimes.md" if q else ROOT / "docs" / "results" / "regimes.md"))
    img_dir = Path(args.img_dir or (out / "img" if q else ROOT / "docs" / "img"))
    data_copy = Path(args.data) if args.data else (None if q else ROOT / "docs" / "data" / "regimes.json")
    if args.from_results:
        saved, st = load_results([Path(f) for f in args.from_results.split(",") if f.strip()], st, data_copy)
        write_page(saved["results"], saved["meta"], st, page, img_dir)
        print(f"results page: {page}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    meta = machine_meta()
    meta["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(st).items()}
    meta["command"] = "python -m benchmarks.bench_regimes " + " ".join(sys.argv[1:] if argv is None else argv)
    meta["started"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    meta["alternating"] = True  # odd slices reverse the policies' order (runs before this key did not)
    t_start = time.monotonic()
    results = run(st, meta)
    meta.update({"finished": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                 "elapsed_min": (time.monotonic() - t_start) / 60,
                 "loadavg_after": " ".join(f"{v:.1f}" for v in os.getloadavg()), "shared": not args.quiet_machine,
                 "tritonserver": results[0]["tritonserver"] if results else "?",
                 "results_json": str(out / "results.json")})
    if data_copy is not None:
        meta["data_copy"] = str(data_copy)
        data_copy.parent.mkdir(parents=True, exist_ok=True)
        data_copy.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    write_page(results, meta, st, page, img_dir)
    print(f"results page: {page}\nraw results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
