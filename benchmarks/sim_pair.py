"""The quickstart's pair on the simulator, beside its served figures: how far aiming the CPU share could go.

    python -m benchmarks.sim_pair                                       # the served pair's data in docs/data/
    python -m benchmarks.sim_pair --data lazybatch-results/pair/pair.json --repository model_repository

Each served repetition's arrivals (the same seeds `benchmarks.pair` drove) are replayed on the latency tables of
the pair's repository (built here with `lazybatch repo default --pair`'s code where absent): Triton's batcher under
plain processor sharing (``ps``, nothing across models), and lazybatch's CPU share under weighted processor
sharing (``wps``, lazybatch/simulator/colocated.py: each model's jobs at the fair-scheduler weight of the nice the
share's rank rule gives it, changed the instant a peer's job starts or ends). No serving cost, no parallel op
stalled by a preempted thread: the simulated figure is the lever's ceiling; the served one, what the kernel gave.
Prints per model and configuration the served and simulated average and p99 (mean [min-max] over repetitions) and
writes OUT/sim_pair.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.colocation.simulate import SIM_OF, Tables, simulate
from benchmarks.harness import command_line, machine_meta, write_json
from benchmarks.harness.stats import fmt, spread


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="docs/data/pair_cpu_share/pair.json", help="a served pair's raw data")
    ap.add_argument("--repository", default="model_repository", help="the pair's repository (its latency tables)")
    ap.add_argument("--out", default="lazybatch-results/sim_pair")
    args = ap.parse_args(argv)
    from lazybatch.shipped import build_pair_repository

    data = json.loads(Path(args.data).read_text())
    meta = data["meta"]
    prefixes, slas, rates = meta["prefixes"], meta["slas_ms"], meta["rates"]
    repo = build_pair_repository(args.repository)
    ours = meta["configs"][0]
    tables = Tables({prefixes[r]: repo / f"{prefixes[r]}_{ours}" / "1" / "latency.json" for r in ("small", "large")})
    kinds = {prefixes[r]: r for r in ("small", "large")}
    rows = []
    # the pinned baseline (a core per model) is a partition the simulator has no model of: it shares one device
    skipped = [cfg for cfg in meta["configs"] if cfg not in SIM_OF]
    if skipped:
        print(f"not simulated (no model of a partitioned device): {', '.join(skipped)}")
    for cfg in [c for c in meta["configs"] if c in SIM_OF]:
        for kind, role in kinds.items():
            served = [r for r in data["runs"] if r["mode"] == "together" and r["config"] == cfg and r["role"] == role]
            sims = [simulate(tables, cfg, {p: rates[kinds[p]] for p in kinds}, meta["duration_s"],
                             meta["seed"] + k, {p: slas[kinds[p]] for p in kinds},
                             {p: meta["t1_ms"][kinds[p]] for p in kinds})["models"][kind]
                    for k in range(meta["reps"])]
            rows.append({"config": cfg, "model": kind, "role": role,
                         "served_avg_ms": spread([r["avg_ms"] for r in served]),
                         "served_p99_ms": spread([r["p99_ms"] for r in served]),
                         "sim_avg_ms": spread([s["avg_ms"] for s in sims]),
                         "sim_p99_ms": spread([s["p99_ms"] for s in sims])})
    lines = ["| config | model | served avg ms | simulated avg ms | served p99 ms | simulated p99 ms |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [fmt(r[k], 1) for k in ("served_avg_ms", "sim_avg_ms", "served_p99_ms", "sim_p99_ms")]
        lines.append(f"| {r['config']} | {r['role']} {r['model']} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    write_json(Path(args.out) / "sim_pair.json",
               {"meta": {**machine_meta(), "command": command_line(), "data": args.data,
                         "served_commit": meta.get("commit"), "reps": meta["reps"], "not_simulated": skipped},
                "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
