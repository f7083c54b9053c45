"""The NPU-modelled latency tables of the LazyBatching paper's three models (Table II), shipped in ``data/``.

``python -m lazybatch.npu_model.paper [--out DIR]`` exports ResNet-50, GNMT and Transformer from the zoo
(``lazybatch export``), splits them into stages (``lazybatch split``, default granularity) and writes
``npu_<model>.json`` for batch sizes 1..64 on the Table I NPU (weight stationary, 1-byte data), about a minute.
``--scaled`` writes ``npu_<model>_paperscale.json``: the same tables scaled to the paper's single-input latency.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .config import NPUConfig
from .tables import latency_table

DATA = Path(__file__).with_name("data")
MODELS = ("resnet50", "gnmt", "transformer")
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 48, 64]


def table_path(model: str) -> Path:
    """Path of the shipped NPU table of ``model`` (use it as ``lazybatch simulate --model PATH``)."""
    return DATA / f"npu_{model}.json"


def build(model: str, workdir: Path, cfg: NPUConfig | None = None):
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    src = workdir / f"{model}.onnx"
    export_model(model, src)
    split_model(src, workdir / f"{model}_stages")
    table, _ = latency_table(workdir / f"{model}_stages", BATCH_SIZES, cfg or NPUConfig(), name=f"npu_{model}")
    table.meta["source"] = f"lazybatch export {model} | lazybatch split (default granularity)"
    return table


#: single-input latency of the paper's models (Table II), ms; seq2seq at the mean lengths of the length histogram
PAPER_SINGLE_MS = {"resnet50": 1.1, "gnmt": 7.2, "transformer": 2.4}


def scaled_to_paper(model: str):
    """The shipped NPU table of ``model`` with every latency scaled so that a single request takes Table II's time.

    Scaling a table by k and running it at rate r and SLA s behaves like the unscaled table at r * k and s / k (with
    batching windows scaled alike): this keeps the NPU model's shape (batch scaling, per-stage shares) and puts the
    load where the paper's rates put it, to separate effects of shape from effects of our slower exports.
    """
    from lazybatch.batcher.latency_table import LatencyTable
    from lazybatch.batcher.lengths import LengthHistogram
    from lazybatch.formats.histograms import shipped_histogram

    table = LatencyTable.load(table_path(model))
    mean = round(LengthHistogram.load(shipped_histogram()).mean())  # the WMT histogram the simulator ships
    ours = table.whole_graph_latency(1, mean, mean)
    k = PAPER_SINGLE_MS[model] * 1e-3 / ours
    meta = dict(table.meta, scaled_by=k, scaled_note=f"scaled so one request at {mean} tokens takes "
                                                     f"{PAPER_SINGLE_MS[model]} ms (paper Table II)")
    from lazybatch.batcher.graph import ModelGraph

    graph = ModelGraph(f"{table.name}_paperscale", table.graph.stages)
    return LatencyTable(graph, table.batch_sizes, [[v * k for v in row] for row in table.measured],
                        provenance=table.provenance + f"; latencies x {k:.4f} (scaled to Table II)", meta=meta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument("--model", action="append", choices=MODELS)
    ap.add_argument("--scaled", action="store_true",
                    help="write npu_<model>_paperscale.json from the shipped tables (see scaled_to_paper) instead")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scaled:
        for model in args.model or MODELS:
            table = scaled_to_paper(model)
            path = table.save(args.out / f"npu_{model}_paperscale.json")
            print(f"wrote {path}: latencies x {table.meta['scaled_by']:.4f}")
        return 0
    for model in args.model or MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            table = build(model, Path(tmp))
        path = table.save(args.out / f"npu_{model}.json")
        print(f"wrote {path}: {table.graph.n} stages, single-input sum "
              f"{sum(r[0] for r in table.measured) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
