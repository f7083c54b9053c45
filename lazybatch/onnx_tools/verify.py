"""Proof that the chained stages compute what the whole graph computes, on random inputs at batch 1 and 8.

Float outputs must agree within ``TOLERANCE`` times the output's scale (its largest magnitude); integer and bool
outputs (e.g. ArgMax tokens) must agree exactly. Both runs use onnxruntime with the same settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

from .runtime import StageChain, random_feeds

TOLERANCE = 1e-5
BATCH_SIZES = (1, 8)


def compare(whole: Mapping[str, np.ndarray], chain: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, a in whole.items():
        b = chain[name]
        if a.shape != b.shape:
            out[name] = {"max_abs_err": float("inf"), "rel_err": float("inf"), "scale": 0.0, "mismatches": -1}
            continue
        if np.issubdtype(a.dtype, np.floating):
            err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            scale = float(np.max(np.abs(a))) if a.size else 0.0
            rel = err / scale if scale > 0 else err
            if not np.all(np.isfinite(a)) or not np.all(np.isfinite(b)):
                err = rel = float("inf") if not np.array_equal(a, b, equal_nan=True) else 0.0
            out[name] = {"max_abs_err": err, "rel_err": rel, "scale": scale}
        else:
            mism = int(np.sum(a != b))
            out[name] = {"max_abs_err": 0.0 if mism == 0 else float("inf"), "rel_err": 0.0 if mism == 0
                         else float("inf"), "scale": 0.0, "mismatches": mism}
    return out


def verify_dir(directory: str | Path, manifest: Mapping[str, Any], *, batch_sizes: Sequence[int] = BATCH_SIZES,
               seed: int = 0, providers: Sequence[str] = ("CPUExecutionProvider",), progress: bool = False,
               tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Run whole vs chained at each batch size; returns the manifest's ``verify`` section (with ``passed``)."""
    chain = StageChain(directory, manifest, providers)
    rng = np.random.default_rng(seed)
    worst = {"max_abs_err": 0.0, "rel_err": 0.0, "worst_output": None, "worst_batch": None}
    per_batch: dict[str, Any] = {}
    it: Any = batch_sizes
    if progress:
        from tqdm import tqdm
        it = tqdm(batch_sizes, desc="verify", unit="batch")
    for b in it:
        feeds = random_feeds(manifest["graph_inputs"], b, rng)
        try:
            whole = chain.run_whole(feeds)
            chained = chain.run_chain(feeds)
        except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument types
            first = str(e).strip().splitlines()[0][:400] if str(e).strip() else type(e).__name__
            raise ConfigError(f"--verify: onnxruntime failed at batch size {b}: {first}; the model probably "
                              "hard-codes its batch size (a constant shape, Expand, Tile or Concat with a batch "
                              "of 1): re-export it with a dynamic batch dimension") from None
        res = compare(whole, chained)
        per_batch[str(b)] = res
        for name, r in res.items():
            if r["rel_err"] > worst["rel_err"] or worst["worst_output"] is None:
                worst.update(max_abs_err=r["max_abs_err"], rel_err=r["rel_err"], worst_output=name, worst_batch=b)
    return {"batch_sizes": list(batch_sizes), "max_abs_err": worst["max_abs_err"], "rel_err": worst["rel_err"],
            "tolerance": tolerance, "passed": bool(worst["rel_err"] <= tolerance), "seed": seed,
            "worst_output": worst["worst_output"], "worst_batch": worst["worst_batch"], "per_batch": per_batch}
