"""Plot writing shared by the benchmarks: matplotlib is optional (a run without it writes its tables and skips the
figures), drawn off-screen, each figure saved where its page links it and closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence


def pyplot() -> Any | None:
    """matplotlib.pyplot on the off-screen Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(fig: Any, path: str | Path, dpi: int = 100, **kwargs: Any) -> Path:
    """Write ``fig`` to ``path`` (its folder made) and free it: a sweep draws many."""
    import matplotlib.pyplot as plt

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=dpi, **kwargs)
    plt.close(fig)
    return p


def log_panels(runs: Sequence[Any], draw: Callable[[Any, Any], None], title: Callable[[Any], str], xlabel: str,
               ylabel: str, path: str | Path) -> bool:
    """One panel per run side by side, latency on a log scale (``draw(ax, run)`` plots the run's lines, ``title``
    names its panel), the legend on the first; False where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.8), squeeze=False)
    for ax, run in zip(axes[0], runs):
        draw(ax, run)
        ax.set_yscale("log")
        ax.set_title(title(run))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return True


def latency_cdfs(series: dict[str, tuple[Sequence[float], dict]], path: str | Path, *, xlabel: str,
                 title: str) -> Path | None:
    """Latency CDFs on one log-x axis, one line per label (its latencies in ms and matplotlib line options), where
    people would rather look than read a percentile table; None where matplotlib is not installed."""
    import numpy as np

    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, (values, style) in series.items():
        lat = np.sort(np.asarray(values, dtype=float))
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=label, **style)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set(xlabel=xlabel, ylabel="fraction of requests", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return save(fig, path, dpi=110)
