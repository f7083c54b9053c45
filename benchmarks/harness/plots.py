"""Plot writing shared by the benchmarks: matplotlib is optional (a run without it writes its tables and skips the
figures), drawn off-screen, each figure saved where its page links it and closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
