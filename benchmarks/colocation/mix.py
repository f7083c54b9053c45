"""The co-location benchmark's mixes: which models share the server, in what shares, at what rates."""

from __future__ import annotations

KINDS = ["mlp", "mobilenet", "bert", "lm"]  # a small MLP, a CNN, BERT and one decoder model
SKEW = 0.7  # the skewed mix: the CNN's share of the requests
PAIR = ("mlp", "bert", 0.3, 1.1)  # small, large, each one's load as a fraction of its own batch-1 rate
PRIO = ("mobilenet", 0.2, 0.8)  # the urgent model at 20% of its batch-1 rate; the others 80% of the device together


def mixes(names: list[str], kinds: list[str], cnn: str) -> dict[str, dict[str, float]]:
    rest = (1 - SKEW) / (len(kinds) - 1)
    all_mixes = {"equal": {k: 1 / len(kinds) for k in kinds},
                 "skewed": {k: SKEW if k == cnn else rest for k in kinds}}
    return {m: all_mixes[m] for m in names}


def rates_for(load: float, shares: dict[str, float], t1: dict[str, float]) -> dict[str, float]:
    """Requests/s per model: ``shares`` of a total whose batch-1 device time is ``load`` of every second."""
    total = load / sum(s * t1[k] / 1e3 for k, s in shares.items())
    return {k: s * total for k, s in shares.items()}
