"""Plots in the shape of the LazyBatching paper's Fig. 12-15 (matplotlib, from the ``plots`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lazybatch.batcher.errors import ConfigError

from .report import policy_order


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'lazybatch[plots]' (or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _style(label: str) -> dict:
    if label.startswith("LazyB"):
        return {"color": "tab:red", "linewidth": 2.2, "marker": "o", "zorder": 5}
    if label.startswith("Oracle"):
        return {"color": "black", "linestyle": "--", "marker": "x", "zorder": 4}
    if label.startswith("Serial"):
        return {"color": "tab:gray", "marker": "s"}
    return {"marker": ".", "alpha": 0.8}


def _per_model(summary, metric: str, ylabel: str, title: str, path: Path, logy: bool) -> Path:
    plt = _plt()
    models = sorted({r["model"] for r in summary})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    sla0 = min(r["sla_ms"] for r in summary)
    for ax, model in zip(axes[0], models):
        rows = [r for r in summary if r["model"] == model and r["sla_ms"] == sla0]
        for lab in policy_order({r["policy"] for r in rows}):
            rs = sorted((r for r in rows if r["policy"] == lab), key=lambda r: r["rate"])
            x = [r["rate"] for r in rs]
            y = [r[metric] for r in rs]
            lo = [max(0.0, r[metric] - r[f"{metric}_p25"]) for r in rs]
            hi = [max(0.0, r[f"{metric}_p75"] - r[metric]) for r in rs]
            ax.errorbar(x, y, yerr=[lo, hi], label=lab, capsize=2, **_style(lab))
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def latency_vs_rate(summary, path: Path) -> Path:
    return _per_model(summary, "avg_ms", "average latency (ms)",
                      "Average latency vs arrival rate (cf. paper Fig. 12); bars: 25th-75th pct over seeds", path,
                      True)


def throughput_vs_rate(summary, path: Path) -> Path:
    return _per_model(summary, "throughput", "throughput (requests/s)",
                      "Throughput vs arrival rate (cf. paper Fig. 13)", path, True)


def latency_cdf(rows: Sequence[dict], summary, rate: float, path: Path) -> Path | None:
    """CDF at ``rate`` for Serial, LazyB, Oracle and the best GraphB by average latency (cf. Fig. 14)."""
    plt = _plt()
    have = [r for r in rows if r.get("latencies_ms") and r["rate"] == rate]
    if not have:
        return None
    models = sorted({r["model"] for r in have})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        sla0 = min(r["sla_ms"] for r in have if r["model"] == model)
        cand = [s for s in summary if s["model"] == model and s["rate"] == rate and s["sla_ms"] == sla0
                and s["policy"].startswith("GraphB")]
        best = min(cand, key=lambda s: s["avg_ms"])["policy"] if cand else None
        for r in have:
            if r["model"] != model or r["sla_ms"] != sla0:
                continue
            lab = r["policy"]
            if lab.startswith("GraphB") and lab != best:
                continue
            xs = sorted(r["latencies_ms"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot(xs, ys, label=lab, **{k: v for k, v in _style(lab).items() if k != "marker"})
        ax.set_xscale("log")
        ax.set_title(f"{model} at {rate:g} requests/s")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Latency CDF under high load (cf. paper Fig. 14; best GraphB by average latency)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def violation_vs_sla(summary, rate: float, path: Path) -> Path | None:
    """SLA violation rate vs SLA target at ``rate`` (cf. Fig. 15)."""
    plt = _plt()
    rows = [r for r in summary if r["rate"] == rate]
    if len({r["sla_ms"] for r in rows}) < 2:
        return None
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mr = [r for r in rows if r["model"] == model]
        for lab in policy_order({r["policy"] for r in mr}):
            rs = sorted((r for r in mr if r["policy"] == lab), key=lambda r: r["sla_ms"])
            ax.plot([r["sla_ms"] for r in rs], [100 * r["sla_violation"] for r in rs], label=lab, **_style(lab))
        ax.set_title(f"{model} at {rate:g} requests/s")
        ax.set_xlabel("SLA target (ms)")
        ax.set_ylabel("SLA violations (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("SLA violation rate vs SLA target (cf. paper Fig. 15)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
