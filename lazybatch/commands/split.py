"""``lazybatch split MODEL.onnx --out DIR``: cut any ONNX model into layer stages plus manifest.json."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("split", help="cut an ONNX model into per-layer stages (and prove them equal with --verify)",
                       description="Cut MODEL.onnx at layer boundaries where few tensors cross, write one ONNX file "
                                   "per stage, the batchable whole model and manifest.json into DIR. DIR appears "
                                   "only when everything succeeded.")
    p.add_argument("model", type=Path, metavar="MODEL.onnx")
    p.add_argument("--out", required=True, type=Path, help="output directory (must not exist unless --force)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--max-stages", type=int, metavar="K",
                   help="exactly K stages with balanced FLOPs (K at most the finest split the graph allows)")
    g.add_argument("--min-stage-cost", metavar="FLOPS",
                   help="grow each stage to at least this many FLOPs per sample, e.g. 500M or 2e9")
    p.add_argument("--max-cross", type=int, metavar="N",
                   help="allow cuts where up to N activations cross (default: the narrowest cuts between layers)")
    p.add_argument("--graph-optimization-level", choices=["basic", "extended", "all"], default=None,
                   help="optimise the whole graph with onnxruntime at this level (its SessionOptions name) BEFORE "
                        "cutting it, so that stages keep the fusions and the layout the whole graph gets; 'all' "
                        "makes stages specific to this CPU and onnxruntime version (recorded in the manifest and "
                        "checked when they are loaded). Default: cut the model as given (portable)")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...", default=None,
                   help="size per sample (no batch) of an input with dynamic dimensions besides the batch, e.g. "
                        "images=3,640,640; repeat for several inputs. The stages keep those dimensions dynamic; the "
                        "sizes are what --verify and profiling run the model at (recorded in the manifest as "
                        "example_dims). Default: the first of 64, 128, 224, 32, 256, 16, ... at which the model runs")
    p.add_argument("--verify", action="store_true",
                   help="run whole graph and chained stages in onnxruntime at batch 1 and 8; fail unless they agree")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.onnx_tools.plan import parse_cost
    from lazybatch.onnx_tools.probe import parse_input_shapes
    from lazybatch.onnx_tools.split import split_model

    cost = parse_cost(args.min_stage_cost) if args.min_stage_cost is not None else None
    res = split_model(args.model, args.out, max_stages=args.max_stages, min_stage_cost=cost,
                      max_cross=args.max_cross, verify=args.verify, force=args.force, progress=True,
                      graph_optimization_level=args.graph_optimization_level,
                      input_shapes=parse_input_shapes(args.input_shape))
    m = res.manifest
    types = sorted({s["type"] for s in m["stages"]})
    print(f"wrote {res.out}/: {len(m['stages'])} stages ({', '.join(types)}; the graph allows up to "
          f"{m['max_stages']}), manifest.json, {m['whole_model']} in {res.seconds:.1f} s")
    sized = [i for i in m["graph_inputs"] if "example_dims" in i]
    if sized:
        print("dynamic dimensions besides the batch stay dynamic in the stages; verify and profile run them at "
              + ", ".join(f"{i['name']}={','.join(map(str, i['example_dims']))}" for i in sized)
              + " (--input-shape to choose)")
    if m.get("verify"):
        v = m["verify"]
        print(f"verify: passed at batch {', '.join(map(str, v['batch_sizes']))}: max abs error {v['max_abs_err']:.3g}, "
              f"{v['rel_err']:.3g} of the output scale (limit {v['tolerance']:g})")
    return 0
