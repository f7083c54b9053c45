"""Redraw the NPU Fig. 12/13 plots from several sweeps' summary.csv files (e.g. the 7-policy sweep and a separate
Oracle + LazyB sweep of the same tables, rates and seeds), so the Oracle joins the curves without re-running the rest.

    python -m benchmarks.npu_merge_plots docs/data/npu_sim_paperscale_summary.csv \
        docs/data/npu_sim_paperscale_oracle_summary.csv --out docs/img --prefix npu_

Rows of a later file replace equal (model, policy, rate, SLA) rows of an earlier one (LazyB appears in both; with
the same seeds its figures are the same).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from lazybatch.simulator import plots


def _num(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def load(paths: list[Path]) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for p in paths:
        with p.open() as f:
            for r in csv.DictReader(f):
                r = {k: _num(v) if k not in ("model", "policy", "policy_spec") else v for k, v in r.items()}
                rows[(r["model"], r["policy"], r["rate"], r["sla_ms"])] = r
    return sorted(rows.values(), key=lambda r: (r["model"], r["rate"], r["sla_ms"], r["policy"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summaries", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--prefix", default="npu_")
    args = ap.parse_args()
    summary = load(args.summaries)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in (plots.latency_vs_rate(summary, args.out / f"{args.prefix}fig12_latency_vs_rate.png"),
              plots.throughput_vs_rate(summary, args.out / f"{args.prefix}fig13_throughput_vs_rate.png")):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
