"""Console tables and result files of a sweep."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence, TextIO

from .sweep import Comparison, to_jsonable

_ORDER = ("Serial", "AdHoc", "GraphB", "BatchMonitor", "MaxBatchDeadline", "LazyB", "Oracle")


def policy_order(labels: set[str]) -> list[str]:
    def key(label: str) -> tuple:
        fam = next((i for i, f in enumerate(_ORDER) if label.startswith(f)), len(_ORDER))
        num = label[label.find("(") + 1:label.find(")")] if "(" in label else ""
        try:
            n = float(num.split(",")[0])
        except ValueError:
            n = 0.0
        return fam, n, label
    return sorted(labels, key=key)


def _fmt(v: float, kind: str) -> str:
    if v != v:  # NaN
        return "-"
    if kind == "pct":
        return f"{v * 100:.1f}%"
    if kind == "ms":
        return f"{v:.2f}" if v < 100 else f"{v:.0f}"
    if kind == "batch":
        return f"{v:.2f}"
    if kind == "energy":
        return f"{v:.3g}"
    return f"{v:.0f}"


def print_tables(summary: Sequence[dict], comparisons: Sequence[Comparison], out: TextIO, *,
                 header: str = "") -> None:
    models = sorted({r["model"] for r in summary})
    for model in models:
        rows = [r for r in summary if r["model"] == model]
        labels = policy_order({r["policy"] for r in rows})
        slas = sorted({r["sla_ms"] for r in rows})
        rates = sorted({r["rate"] for r in rows})
        seeds = rows[0]["seeds"]
        print(f"\n== {model} ({header}mean of {seeds} seed{'s' if seeds > 1 else ''}) ==", file=out)
        cells = {(r["policy"], r["rate"], r["sla_ms"]): r for r in rows}
        width = max(9, *(len(lab) + 1 for lab in labels))
        for title, key, kind, per_sla in (("average latency, ms", "avg_ms", "ms", False),
                                          ("p99 latency, ms", "p99_ms", "ms", False),
                                          ("throughput, requests/s", "throughput", "num", False),
                                          ("mean executed batch size", "mean_batch", "batch", False),
                                          ("modelled energy per request, mJ (NPU model, dynamic energy only)",
                                           "energy_mj_per_req", "energy", False),
                                          ("SLA violation rate", "sla_violation", "pct", True)):
            if key == "energy_mj_per_req" and not any(r.get(key, float("nan")) == r.get(key) for r in rows):
                continue  # a measured table: no energy to report
            for sla in (slas if per_sla else slas[:1]):
                suffix = f" (SLA {sla:g} ms)" if per_sla or len(slas) > 1 else ""
                print(f"{title}{suffix}", file=out)
                print("  rate/s " + "".join(f"{lab:>{width}}" for lab in labels), file=out)
                for rate in rates:
                    vals = []
                    for lab in labels:
                        r = cells.get((lab, rate, sla))
                        vals.append(_fmt(r[key], kind) if r else "-")
                    print(f"  {rate:>6g} " + "".join(f"{v:>{width}}" for v in vals), file=out)
        comps = [c for c in comparisons if c.model == model]
        if comps:
            print("LazyB vs the best GraphB(N) at each rate (ratio > 1 favours LazyB)", file=out)
            print(f"  {'rate/s':>6} {'SLA ms':>7} {'latency':>16} {'throughput':>18} {'violations LazyB/best':>24}",
                  file=out)
            for c in comps:
                print(f"  {c.rate:>6g} {c.sla_ms:>7g} {c.latency_ratio:>7.2f}x {c.best_latency['policy']:>8}"
                      f" {c.throughput_ratio:>8.2f}x {c.best_throughput['policy']:>9}"
                      f" {c.lazy['sla_violation'] * 100:>11.1f}% / {c.best_violation['sla_violation'] * 100:.1f}%"
                      f" {c.best_violation['policy']}", file=out)


def write_csv(rows: Sequence[dict], path: Path) -> Path:
    if not rows:
        path.write_text("")
        return path
    keys = [k for k in rows[0] if k not in ("batch_hist", "latencies_ms")]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items() if k in keys})
    return path


def write_results(out_dir: Path, rows: Sequence[dict], summary: Sequence[dict],
                  comparisons: Sequence[Comparison], config: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [write_csv(rows, out_dir / "runs.csv"), write_csv(summary, out_dir / "summary.csv"),
             write_csv([c.as_row() for c in comparisons], out_dir / "lazyb_vs_graphb.csv")]
    doc = {"config": config, "summary": to_jsonable(summary),
           "lazyb_vs_best_graphb": [c.as_row() for c in comparisons],
           "batch_size_histograms": [
               {"model": r["model"], "policy": r["policy"], "rate": r["rate"], "sla_ms": r["sla_ms"],
                "seed": r["seed"], "hist": {str(b): c for b, c in r["batch_hist"].items()}} for r in rows]}
    p = out_dir / "results.json"
    p.write_text(json.dumps(doc, indent=1))
    files.append(p)
    return files
