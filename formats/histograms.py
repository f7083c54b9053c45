"""The length histograms the project ships (package data in lazybatch/simulator/data/, where
``python -m lazybatch.simulator.paper_tables`` writes the WMT one): what seq2seq requests are drawn from by the load
generator, the backend's defaults, the profiler and the simulator alike. Load one with
``lazybatch.batcher.lengths.LengthHistogram.load``."""

from __future__ import annotations

from pathlib import Path

import lazybatch
from lazybatch.batcher.errors import ConfigError

SHIPPED_HISTOGRAMS = {"wmt": "wmt_en_de_lengths.json", "chat": "chat_lengths.json"}


def shipped_histogram(name: str | None = None) -> Path:
    """A length histogram the project ships (lazybatch/simulator/data/): ``wmt``, the synthetic WMT en-de one (the
    default, for translation models), or ``chat``, the long-tailed one the decoder LM is served with."""
    if (name or "wmt") not in SHIPPED_HISTOGRAMS:
        raise ConfigError(f"unknown length histogram {name!r}; the shipped ones are {', '.join(SHIPPED_HISTOGRAMS)}, "
                          "or pass --length-histogram FILE")
    p = Path(lazybatch.__file__).resolve().parent / "simulator" / "data" / SHIPPED_HISTOGRAMS[name or "wmt"]
    if not p.is_file():  # pragma: no cover - the package data is missing
        raise ConfigError("the shipped length histogram is missing; pass --length-histogram FILE")
    return p
