"""The page's plots: the batch-scaling curves of every model, and per model latency and SLA misses by load."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness.plots import pyplot, save
from benchmarks.regimes.policies import ROW_ORDER, Settings


def plot_scaling(results: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        sc = res["scaling"]
        axes[0].plot(sc["batch_sizes"], [v / sc["per_sample_ms"][0] for v in sc["per_sample_ms"]], marker="o",
                     label=f"{res['model']} ({sc['t1_ms']:.1f} ms at b1)")
        axes[1].plot(sc["batch_sizes"], sc["whole_ms"], marker="o", label=res["model"])
    axes[0].set_ylabel("per-sample latency / batch-1 latency")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("whole-program latency (ms)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("batch size")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=100)


def plot_model(res: dict, path: Path, st: Settings) -> None:
    plt = pyplot()
    if plt is None:
        return
    key = f"{st.sched_sla_multiple:g}x"
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    pols = [p for p in ROW_ORDER if any(c["policy"] == p for c in res["cells"])]
    for p in pols:
        cs = sorted((c for c in res["cells"] if c["policy"] == p), key=lambda c: c["load"])
        x = [c["load"] * 100 for c in cs]
        style = {"linewidth": 2.5} if p == "lazy" else {}
        axes[0].plot(x, [c["avg_ms"] for c in cs], marker="o", label=p, **style)
        axes[1].plot(x, [c["p99_ms"] for c in cs], marker="o", label=p, **style)
        axes[2].plot(x, [c["violation"][key] * 100 for c in cs], marker="o", label=p, **style)
        axes[3].plot(x, [c["throughput"] for c in cs], marker="o", label=p, **style)
        pcs = sorted((c for c in res["perf"] if c["policy"] == p and "avg_ms" in c), key=lambda c: c["load"])
        if pcs:
            axes[0].scatter([c["load"] * 100 for c in pcs], [c["avg_ms"] for c in pcs], marker="x", s=50,
                            color=axes[0].lines[-1].get_color())
    axes[0].set_ylabel("average latency (ms); x: perf_analyzer")
    axes[1].set_ylabel("p99 latency (ms)")
    axes[2].set_ylabel(f"SLA violations at {key} t1 (%)")
    axes[3].set_ylabel("throughput (requests/s)")
    for ax in axes[:2]:
        ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("offered load (% of batch-1 service rate)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{res['model']}: {res['description']} ({res['scaling']['regime']})")
    fig.tight_layout()
    save(fig, path, dpi=90)
