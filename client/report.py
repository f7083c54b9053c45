"""What a load run reports: ``lazybatch load``'s table and files (``format_table``, ``write_reports``: CSV, JSON,
plots), and one report for both load drivers, ``lazybatch load`` (load.json) and perf_analyzer (perf.json) side by
side (``write_combined``).

Why: the two drivers measure differently (our open-loop client counts client-side latency per request and SLA
violations; perf_analyzer reports its own percentiles and the server's queue/compute split), and users compare a
model's rows from both. Both commands call :func:`write_combined` on their output folder, so running
``lazybatch load ... --out D`` and ``lazybatch perf ... --out D`` in either order leaves ``D/report.csv`` and
``D/report.md`` with every row of both, keyed by (model, offered rate). Streamed models (gRPC streams) add the
time to first token and per output token from both drivers (perf_analyzer's from its profile export).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .capacity import steady
from .load import AGGREGATE

if TYPE_CHECKING:
    from .load import LoadResult

COLUMNS = ("model", "rate", "driver", "throughput", "avg_ms", "p50_ms", "p90_ms", "p99_ms", "sla_violation_rate",
           "errors", "server_queue_ms", "server_compute_ms", "ttft_avg_ms", "ttft_p99_ms", "tpot_avg_ms")
STREAM_COLUMNS = ("ttft_avg_ms", "ttft_p99_ms", "tpot_avg_ms")


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return data if isinstance(data, list) else []


def combined_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of load.json and perf.json in ``out_dir``, in COLUMNS, sorted by model, rate, driver."""
    d = Path(out_dir)
    rows: list[dict[str, Any]] = []
    for r in _read(d / "load.json"):
        rows.append({"model": r.get("model"), "rate": _num(r.get("offered_rate")), "driver": "lazybatch load",
                     "throughput": _num(r.get("throughput")), "avg_ms": _num(r.get("avg_ms")),
                     "p50_ms": _num(r.get("p50_ms")), "p90_ms": _num(r.get("p90_ms")),
                     "p99_ms": _num(r.get("p99_ms")), "sla_violation_rate": _num(r.get("sla_violation_rate")),
                     "errors": int(_num(r.get("errors")) or 0), "server_queue_ms": math.nan,
                     "server_compute_ms": math.nan} | {k: _num(r.get(k)) for k in STREAM_COLUMNS})
    for r in _read(d / "perf.json"):
        rows.append({"model": r.get("model"), "rate": _num(r.get("request_rate")), "driver": "perf_analyzer",
                     "throughput": _num(r.get("throughput")), "avg_ms": _num(r.get("avg_ms")),
                     "p50_ms": _num(r.get("p50_ms")), "p90_ms": _num(r.get("p90_ms")),
                     "p99_ms": _num(r.get("p99_ms")), "sla_violation_rate": math.nan,
                     "errors": 0, "server_queue_ms": _num(r.get("server_queue_ms")),
                     "server_compute_ms": _num(r.get("server_compute_ms"))}
                    | {k: _num(r.get(k)) for k in STREAM_COLUMNS})
    rows.sort(key=lambda r: (str(r["model"]), r["rate"], r["driver"]))
    return rows


def _fmt(v: Any, pct: bool = False) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v * 100:.1f}%" if pct else f"{v:.2f}"
    return str(v)


def write_combined(out_dir: str | Path) -> Path | None:
    """Write ``report.csv`` and ``report.md`` in ``out_dir`` from whatever of load.json/perf.json is there.

    Returns the markdown path, or None when neither file exists."""
    d = Path(out_dir)
    rows = combined_rows(d)
    if not rows:
        return None
    with open(d / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)
    streamed = any(not math.isnan(r["ttft_avg_ms"]) for r in rows)  # the columns only where a model streamed
    lines = ["| model | rate/s | driver | throughput/s | avg ms | p50 ms | p90 ms | p99 ms | SLA violations | errors "
             "| server queue ms | server compute ms |" + (" TTFT avg ms | TTFT p99 ms | TPOT avg ms |" if streamed
                                                          else ""), "|" + "---|" * (15 if streamed else 12)]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["model"]), f"{r['rate']:g}", r["driver"], _fmt(r["throughput"]), _fmt(r["avg_ms"]),
            _fmt(r["p50_ms"]), _fmt(r["p90_ms"]), _fmt(r["p99_ms"]), _fmt(r["sla_violation_rate"], pct=True),
            str(r["errors"]), _fmt(r["server_queue_ms"]), _fmt(r["server_compute_ms"]),
            *([_fmt(r[k]) for k in STREAM_COLUMNS] if streamed else [])]) + " |")
    note = ("\nSLA violations are counted by `lazybatch load` only (perf_analyzer does not know the SLA); the "
            "server's queue/compute split comes from perf_analyzer only. perf_analyzer's rate is what it was asked "
            "for; see its log for the rate it achieved.\n")
    md = d / "report.md"
    md.write_text("\n".join(lines) + "\n" + note)
    return md


# ---------------------------------------------------------------------- lazybatch load's own report
LOAD_COLUMNS = ("model", "offered_rate", "send_rate", "sent", "ok", "errors", "throughput", "avg_ms", "p50_ms",
           "p90_ms", "p99_ms", "sla_violation_rate")


def format_table(results: Sequence[LoadResult]) -> str:
    head = (f"{'model':<22} {'rate/s':>7} {'sent/s':>7} {'sent':>6} {'ok':>6} {'err':>5} {'thr/s':>7} "
            f"{'avg ms':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'SLA viol':>8}")
    lines = [head, "-" * len(head)]
    for k, r in enumerate(results):
        if r.model == AGGREGATE:  # models driven together: their pooled row under them, a group a rate
            lines.append("-" * len(head))
        elif k and results[k - 1].model == AGGREGATE:
            lines.append("")
        lines.append(f"{r.model:<22} {r.offered_rate:>7.1f} {r.send_rate:>7.1f} {r.sent:>6d} {r.ok:>6d} "
                     f"{r.errors:>5d} {r.throughput:>7.1f} {r.avg_ms:>8.1f} {r.p50_ms:>8.1f} {r.p90_ms:>8.1f} "
                     f"{r.p99_ms:>8.1f} {r.sla_violation_rate * 100 if r.sent else math.nan:>7.1f}%")
    unsteady = [(r, s) for r in results if r.model != AGGREGATE and r.records
                for s in [steady(r.records, r.send_rate, r.duration_s)] if not s.steady]
    if unsteady:  # past capacity the figures above measure how long the run was, not a user's latency
        lines += ["", "Not sustained (read throughput here, not latency; `--capacity` finds the highest rate that is):"]
        lines += [f"  {r.model} @ {r.offered_rate:g}/s: {s.why}" for r, s in unsteady]
    if any(r.model == AGGREGATE for r in results):  # models driven together: each one's SLA, share, answers
        lines += ["", together_table(results)]
    mixed = [r for r in results if r.classes]
    if mixed:  # traffic classes: each class's own figures, against its own SLA
        head = (f"{'model':<22} {'rate/s':>7} {'class':<12} {'SLA ms':>7} {'sent':>6} {'ok':>6} {'thr/s':>7} "
                f"{'avg ms':>8} {'p99':>8} {'SLA viol':>8}")
        lines += ["", head, "-" * len(head)]
        for r in mixed:
            for name, c in r.classes.items():
                sla = "-" if c["sla_ms"] is None else f"{c['sla_ms']:g}"
                lines.append(f"{r.model:<22} {r.offered_rate:>7.1f} {name:<12} {sla:>7} {c['sent']:>6d} {c['ok']:>6d} "
                             f"{c['throughput']:>7.1f} {c['avg_ms']:>8.1f} {c['p99_ms']:>8.1f} "
                             f"{c['sla_violation_rate'] * 100 if c['sent'] else math.nan:>7.1f}%")
    streamed = [r for r in results if r.streaming]
    if streamed:  # time to first token, time per output token after it
        head = (f"{'streamed':<22} {'rate/s':>7} {'tokens':>7} {'TTFT avg':>9} {'p50':>8} {'p99':>8} "
                f"{'TPOT avg':>9} {'p99':>8}")
        lines += ["", head, "-" * len(head)]
        for r in streamed:
            lines.append(f"{r.model:<22} {r.offered_rate:>7.1f} {r.tokens:>7d} {r.ttft_avg_ms:>9.1f} "
                         f"{r.ttft_p50_ms:>8.1f} {r.ttft_p99_ms:>8.1f} {r.tpot_avg_ms:>9.2f} {r.tpot_p99_ms:>8.2f}")
    return "\n".join(lines)


def shares_in_groups(models: Sequence[str], rates: Sequence[float]) -> list[float]:
    """Rows of models driven together, each group closed by its ``AGGREGATE`` row: each row's rate as a share of
    its group's aggregate rate (1 for the aggregate row; NaN for a row with no aggregate after it)."""
    out, agg = [], math.nan
    for model, rate in zip(reversed(models), reversed(rates)):
        agg = rate if model == AGGREGATE else agg
        out.append(rate / agg if agg else math.nan)
    return out[::-1]


def together_table(results: Sequence[LoadResult]) -> str:
    """Models driven together (``load --together``): each model's share of the aggregate rate, its SLA, requests
    lost or answered twice (both must be 0), and its p99 against its p99 alone (``--alone``)."""
    head = (f"{'together':<22} {'rate/s':>7} {'share':>6} {'SLA ms':>7} {'lost':>5} {'dup':>5} "
            f"{'p99 alone':>9} {'p99/alone':>9}")
    lines = [head, "-" * len(head)]
    share = shares_in_groups([r.model for r in results], [r.offered_rate for r in results])
    for k, r in enumerate(results):
        sla = "each" if r.model == AGGREGATE else "-" if r.sla_ms is None else f"{r.sla_ms:g}"
        lines.append(f"{r.model:<22} {r.offered_rate:>7.1f} {share[k]:>6.2f} {sla:>7} {r.lost:>5d} "
                     f"{r.duplicated:>5d} {r.p99_alone_ms:>9.1f} {r.p99_ms / r.p99_alone_ms:>9.2f}")
    return "\n".join(lines)


def write_reports(results: Sequence[LoadResult], out_dir: str | Path, *, stem: str = "load",
                  plot: bool = True) -> list[Path]:
    """``stem.csv``, ``stem.json`` and (with matplotlib) ``stem.png``: p50/p99 latency vs offered load per model."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    rows = [r.row() for r in results]
    p = d / f"{stem}.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(LOAD_COLUMNS))
        w.writeheader()
        w.writerows(rows)
    paths.append(p)
    p = d / f"{stem}.json"
    p.write_text(json.dumps([r.row() | {"error_kinds": r.error_kinds, "classes": r.classes} for r in results],
                            indent=1))
    paths.append(p)
    if plot and results:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return paths
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for model in dict.fromkeys(r.model for r in results):
            rs = sorted((r for r in results if r.model == model), key=lambda r: r.offered_rate)
            x = [r.offered_rate for r in rs]
            axes[0].plot(x, [r.p50_ms for r in rs], marker="o", label=f"{model} p50")
            axes[0].plot(x, [r.p99_ms for r in rs], marker="x", linestyle="--", label=f"{model} p99")
            axes[1].plot(x, [r.sla_violation_rate * 100 for r in rs], marker="o", label=model)
        axes[0].set_xlabel("offered load (requests/s)")
        axes[0].set_ylabel("latency (ms)")
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=7)
        axes[1].set_xlabel("offered load (requests/s)")
        axes[1].set_ylabel("SLA violations (%)")
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        p = d / f"{stem}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
        if any(r.classes for r in results):
            paths.append(plot_classes(results, d / f"{stem}_classes.png"))
    return paths


def plot_classes(results: Sequence[LoadResult], path: Path) -> Path:
    """Per traffic class: p99 latency and SLA violations against offered load, a line per model and class."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for model in dict.fromkeys(r.model for r in results if r.classes):
        rs = sorted((r for r in results if r.model == model and r.classes), key=lambda r: r.offered_rate)
        for name in dict.fromkeys(n for r in rs for n in r.classes):
            x = [r.offered_rate for r in rs if name in r.classes]
            cs = [r.classes[name] for r in rs if name in r.classes]
            axes[0].plot(x, [c["p99_ms"] for c in cs], marker="o", label=f"{model} {name}")
            axes[1].plot(x, [c["sla_violation_rate"] * 100 for c in cs], marker="o", label=f"{model} {name}")
    axes[0].set_xlabel("offered load (requests/s)")
    axes[0].set_ylabel("p99 latency (ms)")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("offered load (requests/s)")
    axes[1].set_ylabel("SLA violations of the class (%)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
