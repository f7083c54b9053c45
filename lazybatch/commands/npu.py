"""``lazybatch npu``: NPU-modelled latency tables and single-layer queries on the analytical systolic-array model."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from lazybatch.batcher.errors import ConfigError
from lazybatch.commands import comma_list

DEFAULT_BATCHES = "1,2,4,8,16,32,48,64"


def _add_config_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("NPU (defaults: the LazyBatching paper's Table I)")
    g.add_argument("--config", type=Path, help="NPU configuration JSON (keys as `lazybatch npu config` prints); "
                                               "the flags below override it")
    g.add_argument("--dataflow", choices=("os", "ws"), help="output or weight stationary (ws)")
    g.add_argument("--array", help="systolic array ROWSxCOLS (128x128)")
    g.add_argument("--freq-mhz", type=float, help="clock (700)")
    g.add_argument("--act-sram-mb", type=float, help="activation SRAM, MiB (8)")
    g.add_argument("--wgt-sram-mb", type=float, help="weight SRAM, MiB (4)")
    g.add_argument("--bandwidth-gbs", type=float, help="DRAM bandwidth, GB/s (360)")
    g.add_argument("--mem-latency", type=int, help="memory latency, cycles (100)")
    g.add_argument("--dtype-bytes", type=int, help="bytes per value: 1 (int8), 2 (fp16/bf16), 4 (fp32) (1)")
    g.add_argument("--weight-prefetch", action="store_true",
                   help="WS: load the next weight tile while the current one computes (TPU v1); not in SCALE-Sim")


def npu_config(args: argparse.Namespace):
    from lazybatch.npu_model import NPUConfig, parse_array

    cfg = NPUConfig()
    if args.config:
        try:
            data = json.loads(Path(args.config).read_text())
        except OSError as e:
            raise ConfigError(f"cannot read: {e.strerror}", source=str(args.config)) from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"not valid JSON ({e.msg})", source=str(args.config)) from None
        cfg = NPUConfig.from_dict(data, source=str(args.config))
    changes: dict = {}
    if args.dataflow:
        changes["dataflow"] = args.dataflow
    if args.array:
        changes["rows"], changes["cols"] = parse_array(args.array)
    if args.freq_mhz is not None:
        changes["freq_hz"] = args.freq_mhz * 1e6
    if args.act_sram_mb is not None:
        changes["act_sram_bytes"] = int(args.act_sram_mb * 2**20)
    if args.wgt_sram_mb is not None:
        changes["wgt_sram_bytes"] = int(args.wgt_sram_mb * 2**20)
    if args.bandwidth_gbs is not None:
        changes["dram_bw_bytes_s"] = args.bandwidth_gbs * 1e9
    if args.mem_latency is not None:
        changes["mem_latency_cycles"] = args.mem_latency
    if args.dtype_bytes is not None:
        changes["dtype_bytes"] = args.dtype_bytes
    if args.weight_prefetch:
        changes["weight_prefetch"] = True
    return cfg.replace(**changes) if changes else cfg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("npu", help="NPU-modelled latency tables (analytical systolic-array model)",
                       description="An analytical model of a TPU-like systolic-array NPU (default: the LazyBatching "
                                   "paper's Table I) answers how long each stage of a model takes at each batch size.")
    nsub = p.add_subparsers(dest="npu_command", metavar="SUBCOMMAND", required=True)

    lat = nsub.add_parser("latency", help="write the stage x batch-size latency table of a model on the NPU",
                          description="TARGET: a directory from `lazybatch split` (one row per stage, typed as its "
                                      "manifest says), an .onnx file (one row), or a zoo model name (resnet50, gnmt, "
                                      "transformer, ...: exported and split into a temporary directory first).")
    lat.add_argument("target", metavar="MODEL_OR_STAGE_DIR")
    lat.add_argument("--batch", default=DEFAULT_BATCHES,
                     help=f"batch sizes, comma-separated, must include 1 ({DEFAULT_BATCHES})")
    lat.add_argument("--out", type=Path, help="write the latency table here (.json or .csv)")
    lat.add_argument("--name", help="model name in the table (default: the manifest's)")
    lat.add_argument("--strict", action="store_true",
                     help="refuse ops the model has no cost for (default: one vector op per output element, reported)")
    lat.add_argument("--nodes", type=int, default=0, metavar="N",
                     help="also print the N most expensive nodes at batch 1")
    lat.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_config_args(lat)
    lat.set_defaults(func=run_latency)

    lay = nsub.add_parser("layer", help="cost of one convolution or GEMM at one batch size")
    what = lay.add_mutually_exclusive_group(required=True)
    what.add_argument("--conv", metavar="H,W,C,R,S,M,STRIDE", help="padded input HxW, C channels, RxS kernel, "
                                                                  "M filters, stride (SCALE-Sim's description)")
    what.add_argument("--gemm", metavar="M,K,N", help="A[M,K] @ W[K,N], W a weight")
    lay.add_argument("--batch", type=int, default=1, help="batch size (1)")
    _add_config_args(lay)
    lay.set_defaults(func=run_layer)

    val = nsub.add_parser("validate", help="compare compute cycles with SCALE-Sim on ResNet-50 convolution layers "
                                           "(needs the npu-validate extra)")
    val.add_argument("--model", type=Path, help="ONNX model whose Conv layers to check (default: the zoo's ResNet-50)")
    val.add_argument("--limit", type=int, default=0, help="only the first N distinct layer shapes")
    _add_config_args(val)
    val.set_defaults(func=run_validate)

    q = nsub.add_parser("query", help="ask a served npu_timing model (gRPC) for stage latencies, cycles and energy",
                        description="Queries the npu_timing model of a running server (`lazybatch repo npu-timing` "
                                    "adds it): a model of that repository by name, or layer descriptors.")
    qwhat = q.add_mutually_exclusive_group(required=True)
    qwhat.add_argument("--model", help="a model of the served repository that has stages (e.g. resnet50_eager)")
    qwhat.add_argument("--layer", action="append", metavar="DESC",
                       help="conv:H,W,C,R,S,M,STRIDE or gemm:M,K,N; repeatable (each is one stage)")
    q.add_argument("--stage", default=None, help="stage ids, comma-separated (default: every stage)")
    q.add_argument("--batch", default="1", help="batch sizes, comma-separated (1)")
    q.add_argument("-u", "--url", default="127.0.0.1:8001", help="server address (gRPC; 127.0.0.1:8001)")
    q.add_argument("-i", "--protocol", default="grpc", choices=("grpc", "http"))
    q.add_argument("--timing-model", default="npu_timing", help="name of the timing model (npu_timing)")
    q.add_argument("--json", action="store_true", help="print the answer as JSON")
    q.set_defaults(func=run_query)

    conf = nsub.add_parser("config", help="print the NPU configuration (Table I, or as changed by the flags) as JSON")
    _add_config_args(conf)
    conf.set_defaults(func=lambda a: print(json.dumps(npu_config(a).to_dict(), indent=1)) or 0)


def run_query(args: argparse.Namespace) -> int:
    from lazybatch.client.npu import npu_query

    ans = npu_query(args.url, model=args.model, layers=args.layer, protocol=args.protocol,
                    stages=comma_list(args.stage, "stage", int) if args.stage else None,
                    batches=comma_list(args.batch, "batch", int), timing_model=args.timing_model)
    if args.json:
        print(json.dumps(ans, indent=1))
        return 0
    print(f"{'stage':<28}" + "".join(f"{'b=' + str(b) + ' us':>14}" for b in ans["batch"])
          + "".join(f"{'b=' + str(b) + ' uJ':>14}" for b in ans["batch"]))
    for name, lat, en in zip(ans["stage_name"], ans["latency_us"], ans["energy_uj"]):
        print(f"{name[:27]:<28}" + "".join(f"{v:>14.2f}" for v in lat) + "".join(f"{v:>14.2f}" for v in en))
    return 0


def _resolve_target(target: str, tmp: Path) -> Path:
    p = Path(target)
    if p.exists():
        return p
    from lazybatch.onnx_tools.zoo import MODELS

    if target not in MODELS:
        raise ConfigError(f"{target!r} is neither a file, a split directory nor a zoo model "
                          f"({', '.join(MODELS)})", field="target")
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    onnx_path = tmp / f"{target}.onnx"
    print(f"exporting and splitting {target} into {tmp} ...", file=sys.stderr)
    export_model(target, onnx_path)
    out = tmp / f"{target}_stages"
    split_model(onnx_path, out)
    return out


def run_latency(args: argparse.Namespace) -> int:
    from lazybatch.npu_model.tables import latency_table

    cfg = npu_config(args)
    sizes = comma_list(args.batch, "batch", int)
    with tempfile.TemporaryDirectory() as tmp:
        target = _resolve_target(args.target, Path(tmp))
        table, costs = latency_table(target, sizes, cfg, name=args.name, strict=args.strict,
                                     progress=not args.quiet)
        if args.nodes:
            from lazybatch.npu_model.tables import load_stages

            _, stages = load_stages(target)
            rows = [(st.name, nd, c) for st in stages for nd, c in st.model.node_costs(1, cfg)]
            rows.sort(key=lambda r: -r[2].cycles)
            print(f"{'stage':<14}{'node':<32}{'op':<12}{'us':>10}{'bound':>9}{'util':>7}")
            for st, nd, c in rows[: args.nodes]:
                print(f"{st:<14}{nd.name[:31]:<32}{nd.op:<12}{c.microseconds(cfg):>10.2f}{c.bound:>9}"
                      f"{c.utilization(cfg):>7.0%}")
    sizes = list(table.batch_sizes)
    print(f"{table.name}: {table.graph.n} stages on a {cfg.rows}x{cfg.cols} {cfg.dataflow.upper()} array; "
          "latency in us per stage and batch size")
    print(f"{'stage':<16}{'type':<9}" + "".join(f"{b:>10}" for b in sizes))
    for st in table.graph.stages:
        print(f"{st.name:<16}{st.type.value:<9}" + "".join(f"{v * 1e6:>10.1f}" for v in table.measured[st.index]))
    totals = [sum(table.measured[s][j] for s in range(table.graph.n)) for j in range(len(sizes))]
    print(f"{'sum':<25}" + "".join(f"{v * 1e6:>10.1f}" for v in totals))
    energy = [sum(costs[s][j].energy_pj for s in range(table.graph.n)) * 1e-6 for j in range(len(sizes))]
    print(f"{'energy (uJ)':<25}" + "".join(f"{v:>10.1f}" for v in energy))
    if table.meta.get("unknown_ops"):
        print(f"note: no cost model for {', '.join(table.meta['unknown_ops'])}: priced as one vector op per output "
              "element (--strict refuses them)", file=sys.stderr)
    if args.out:
        table.save(args.out)
        print(f"wrote {args.out}")
    return 0


def run_layer(args: argparse.Namespace) -> int:
    from lazybatch.npu_model import ConvLayer, Gemm, conv_cost, gemm_cost

    cfg = npu_config(args)
    if args.batch < 1:
        raise ConfigError(f"batch must be at least 1, got {args.batch}", field="batch")
    if args.conv:
        v = comma_list(args.conv, "conv", int)
        if len(v) != 7 or min(v) < 1:
            raise ConfigError(f"--conv needs 7 positive integers H,W,C,R,S,M,STRIDE, got {args.conv!r}", field="conv")
        h, w, c, r, s, m, stride = v
        if r > h or s > w:
            raise ConfigError("the kernel is larger than the (padded) input", field="conv")
        cost = conv_cost(ConvLayer("conv", h, w, r, s, c, m, stride), cfg, args.batch)
    else:
        v = comma_list(args.gemm, "gemm", int)
        if len(v) != 3 or min(v) < 1:
            raise ConfigError(f"--gemm needs 3 positive integers M,K,N, got {args.gemm!r}", field="gemm")
        cost = gemm_cost(Gemm(m=v[0] * args.batch, k=v[1], n=v[2]), cfg)
    print(json.dumps(cost.summary(cfg), indent=1))
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from lazybatch.npu_model.scalesim_ref import _import_scalesim, conv_layers, unique_layers
    from lazybatch.npu_model.validate import check_layers, markdown, summarize

    _import_scalesim()
    cfg = npu_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from lazybatch.onnx_tools.zoo import export_model

            model = Path(tmp) / "resnet50.onnx"
            export_model("resnet50", model)
        layers = unique_layers(conv_layers(model))
    if args.limit:
        layers = layers[: args.limit]
    checks = check_layers(layers, cfg, [cfg.dataflow])
    print(markdown(checks))
    for df, s in summarize(checks).items():
        print(f"{df}: worst layer error {s['worst_layer_error_pct']:.3f}%, network error "
              f"{s['network_error_pct']:+.4f}%, query time vs SCALE-Sim: worst 1/{1 / s['worst_time_ratio']:,.0f}")
    return 0
