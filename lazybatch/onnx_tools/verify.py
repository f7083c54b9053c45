"""Proof that the chained stages compute what the whole graph computes, on random inputs at batch 1 and 8.

Every model output and every tensor passed between stages (``boundary:NAME``) is compared. Floats must agree
within ``TOLERANCE`` times the tensor's scale (its largest magnitude); integer and bool outputs (e.g. ArgMax
tokens) must agree exactly. Both runs use onnxruntime with the same settings. At batch 1 the chained stages are
also compared with the original, unmodified file (``original:NAME``). Stages cut from an onnxruntime-optimised
graph (``ort_optimization`` in the manifest) pass tensors that exist only in that graph: their boundaries are
compared with the optimised whole graph, and their outputs also with the unoptimised ``model.onnx``
(``unoptimized:NAME``), so the proof still ends at the model the user gave.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

from lazybatch.sessions.chain import StageChain, make_session, random_feeds

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


def _batch_failure(b: int, e: Exception, specs: Sequence[Mapping[str, Any]] = ()) -> ConfigError:
    first = str(e).strip().splitlines()[0][:400] if str(e).strip() else type(e).__name__
    sized = [s for s in specs if "example_dims" in s]
    if sized:  # the model has dynamic dims besides the batch: the sizes chosen for them are as likely a cause
        shown = " ".join(f"{s['name']}={','.join(map(str, s['example_dims']))}" for s in sized)
        return ConfigError(f"onnxruntime failed at batch size {b}: {first}; the inputs had these sizes per sample "
                           f"for their dynamic dimensions: {shown}. If the model needs other sizes, give them with "
                           "--input-shape NAME=D1,D2,... (e.g. a multiple of 32 for a detector's height and width); "
                           "if it hard-codes its batch size, re-export it with a dynamic batch dimension")
    return ConfigError(f"onnxruntime failed at batch size {b}: {first}; the model probably hard-codes its batch "
                       "size (a constant shape, Expand, Tile or Concat with a batch of 1, or a batch folded into "
                       "another dimension): re-export it with a dynamic batch dimension")


def check_batchable(directory: str | Path, manifest: Mapping[str, Any], batch: int = 2,
                    providers: Sequence[str] = ("CPUExecutionProvider",)) -> None:
    """One run of the whole model at ``batch``: a split without --verify still refuses a model that only works
    at batch 1 (the batchable rewrite cannot see every place a batch of 1 was baked in)."""
    sess = make_session(Path(directory) / manifest["whole_model"], providers)
    feeds = random_feeds(manifest["graph_inputs"], batch, np.random.default_rng(0))
    try:
        sess.run(None, feeds)
    except Exception as e:  # onnxruntime raises its own exception types
        raise _batch_failure(batch, e, manifest["graph_inputs"]) from None


def _instrumented_whole(directory: Path, manifest: Mapping[str, Any], providers: Sequence[str]) -> Any:
    """The whole model with every tensor that crosses a stage boundary added as an output, or None above 2 GB.

    A model whose final output hardly depends on its input (the light_* zoo files have constant weights, so
    their softmax is uniform) would pass an output-only check even if stages were wired wrongly; comparing every
    boundary tensor closes that gap."""
    import onnx

    opt = manifest.get("ort_optimization") or {}
    model = onnx.load(str(directory / (opt.get("whole_model") or manifest["whole_model"])))
    have = {o.name for o in model.graph.output}
    for st in manifest["stages"]:
        for o in st["outputs"]:
            if o["name"] not in have:
                model.graph.output.append(onnx.ValueInfoProto(name=o["name"]))
                have.add(o["name"])
    if model.ByteSize() > 2_000_000_000 - 50_000_000:
        return None
    return make_session(model.SerializeToString(), providers)


def verify_dir(directory: str | Path, manifest: Mapping[str, Any], *, batch_sizes: Sequence[int] = BATCH_SIZES,
               seed: int = 0, providers: Sequence[str] = ("CPUExecutionProvider",), progress: bool = False,
               tolerance: float = TOLERANCE, original: str | Path | None = None) -> dict[str, Any]:
    """Run whole vs chained at each batch size; returns the manifest's ``verify`` section (with ``passed``).

    With ``original`` (the file that was split), batch 1 is also compared against that untouched model, which
    proves the batchable rewrite kept the model's meaning, not only that the stages match the rewrite.
    """
    instrumented = _instrumented_whole(Path(directory), manifest, providers)
    opt = manifest.get("ort_optimization") or {}
    chain = StageChain(directory, manifest, providers, whole=instrumented is None,
                       whole_model=opt.get("whole_model") or manifest["whole_model"])
    unoptimized = make_session(Path(directory) / manifest["whole_model"], providers) if opt else None
    model_outputs = [o["name"] for o in manifest["graph_outputs"]]
    boundaries = [o["name"] for st in manifest["stages"] for o in st["outputs"] if o["name"] not in model_outputs]
    orig = make_session(Path(original), providers) if original is not None else None
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
            if instrumented is not None:
                names = [o.name for o in instrumented.get_outputs()]
                whole_all = dict(zip(names, instrumented.run(names, feeds)))
            else:
                whole_all = chain.run_whole(feeds)
            chained_all = chain.run_chain(feeds, keep_all=True)
            # keep_all runs every stage plainly (in-place stages would overwrite the boundaries); the model
            # outputs are checked on the chain as it is served, in-place residual stages included
            chained = chain.run_chain(feeds) if chain.inplace else {n: chained_all[n] for n in model_outputs}
        except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument types
            raise _batch_failure(b, e, manifest["graph_inputs"]) from None
        res = compare({n: whole_all[n] for n in model_outputs}, chained)
        if instrumented is not None:
            res.update({f"boundary:{k}": v for k, v in compare({n: whole_all[n] for n in boundaries},
                                                               {n: chained_all[n] for n in boundaries}).items()})
        if unoptimized is not None:
            names = [o.name for o in unoptimized.get_outputs()]
            res.update({f"unoptimized:{k}": v for k, v in compare(dict(zip(names, unoptimized.run(names, feeds))),
                                                                  chained).items()})
        if orig is not None and b == 1:
            names = [o.name for o in orig.get_outputs()]
            try:
                ref = dict(zip(names, orig.run(names, {k: v for k, v in feeds.items()
                                                       if k in {i.name for i in orig.get_inputs()}})))
            except Exception as e:
                raise ConfigError(f"--verify: onnxruntime cannot run the original model at batch 1 "
                                  f"({str(e).splitlines()[0][:300]}); check that it loads in onnxruntime") from None
            res.update({f"original:{k}": v for k, v in compare(ref, chained).items()})
        per_batch[str(b)] = res
        for name, r in res.items():
            if r["rel_err"] > worst["rel_err"] or worst["worst_output"] is None:
                worst.update(max_abs_err=r["max_abs_err"], rel_err=r["rel_err"], worst_output=name, worst_batch=b)
    return {"batch_sizes": list(batch_sizes), "max_abs_err": worst["max_abs_err"], "rel_err": worst["rel_err"],
            "tolerance": tolerance, "passed": bool(worst["rel_err"] <= tolerance), "seed": seed,
            "worst_output": worst["worst_output"], "worst_batch": worst["worst_batch"],
            "boundaries_checked": len(boundaries) if instrumented is not None else 0, "per_batch": per_batch}
