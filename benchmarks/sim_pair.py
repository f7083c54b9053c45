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
import math
import sys
from pathlib import Path
from typing import Mapping

import numpy as np

from benchmarks.harness import command_line, machine_meta, write_json
from benchmarks.harness.stats import fmt, percentile, spread

# served configuration -> (policy on the table, how the device is shared); the pinned baseline (a core per model)
# is a partition the simulator has no model of
SIM_OF = {"triton_0us": ("graph:0", "ps"), "triton_5000us": ("graph:5", "ps"), "triton_20000us": ("graph:20", "ps"),
          "triton_0us_twin": ("graph:0", "ps"), "eager_shared": ("eager", "wps"),
          # the large model's stub at a nice by hand: a weight matters only while both run, so it is wps's
          "hand_nice": ("graph:0", "wps")}


class Tables:
    """Each kind's latency table (the lazybatch model's) and, for a decoder, its histogram and length limits."""

    def __init__(self, tables: Mapping[str, Path]) -> None:
        from lazybatch.backend.config_pbtxt import load_config
        from lazybatch.batcher.latency_table import LatencyTable
        from lazybatch.batcher.lengths import LengthHistogram
        from lazybatch.client.seq2seq import info_from_parameters
        from lazybatch.formats.histograms import shipped_histogram

        self.table, self.info, self.hist = {}, {}, {}
        for kind, path in tables.items():
            self.table[kind] = LatencyTable.load(path)
            cfg = load_config(Path(path).parent.parent / "config.pbtxt")
            info = info_from_parameters({k: v.string_value for k, v in cfg.parameters.items()})
            self.info[kind] = info
            self.hist[kind] = None if info is None else LengthHistogram.load(shipped_histogram(info.length_histogram))


def arrivals(tables: Tables, kind: str, rate: float, duration: float, stream_seed: int, sla_ms: float) -> list:
    """The requests `lazybatch load --together` sent for one model's stream seed: its offsets and, for a decoder,
    its source and output lengths (the load generator's LengthSampler with the same seed)."""
    from lazybatch.batcher.request import Request
    from lazybatch.client.load import poisson_schedule
    from lazybatch.client.seq2seq import LengthSampler

    offsets = poisson_schedule(rate, duration, stream_seed, 100_000)
    info = tables.info[kind]
    sampler = LengthSampler(info, None, stream_seed) if info is not None else None
    out = []
    for i, t in enumerate(offsets):
        enc, dec = sampler.draw() if sampler is not None else (1, None)
        out.append(Request(i, t, sla=sla_ms / 1e3, enc_steps=enc, dec_steps=dec))
    return out


def simulate(tables: Tables, config: str, rates: Mapping[str, float], duration: float, seed: int,
             slas: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """One served repetition replayed: ``rates`` (kind -> requests/s) with the stream seeds `lazybatch load
    --together` used (``model_seed(seed, index)``, index the kind's place among the models), each model under
    ``config``'s policy and sharing. Returns kind -> its answered requests' average and p99 (ms)."""
    from lazybatch.batcher.cpu_rank import ShareMember
    from lazybatch.batcher.decisions import DecisionLog
    from lazybatch.batcher.policies.spec import parse_policy
    from lazybatch.batcher.request import Status
    from lazybatch.client.together import model_seed
    from lazybatch.simulator.colocated import ColocatedSimulation, Tenant

    policy, sharing = SIM_OF[config]
    tenants, reqs = [], {}
    for i, (kind, rate) in enumerate(rates.items()):
        reqs[kind] = arrivals(tables, kind, rate, duration, model_seed(seed, i), slas[kind])
        pol = parse_policy(policy).build(max_batch_size=tables.table[kind].max_batch_size,
                                         length_histogram=tables.hist[kind])
        tenants.append(Tenant(kind, tables.table[kind], pol, reqs[kind], share=ShareMember(kind, sla_ms=slas[kind]),
                              log=DecisionLog(capacity=1, enabled=False)))
    ColocatedSimulation([t for t in tenants if t.requests], sharing=sharing).run()
    out = {}
    for kind, rs in reqs.items():
        lat = np.asarray([(r.finish - r.arrival) * 1e3 for r in rs if r.finish is not None and r.status == Status.OK])
        out[kind] = {"avg_ms": float(lat.mean()) if lat.size else math.nan, "p99_ms": percentile(lat, 99)}
    return out


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
    skipped = [cfg for cfg in meta["configs"] if cfg not in SIM_OF]
    if skipped:
        print(f"not simulated (no model of a partitioned device): {', '.join(skipped)}")
    for cfg in [c for c in meta["configs"] if c in SIM_OF]:
        for kind, role in kinds.items():
            served = [r for r in data["runs"] if r["mode"] == "together" and r["config"] == cfg and r["role"] == role]
            sims = [simulate(tables, cfg, {p: rates[kinds[p]] for p in kinds}, meta["duration_s"],
                             meta["seed"] + k, {p: slas[kinds[p]] for p in kinds})[kind]
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
