"""``lazybatch profile DIR``: the per-stage latency table (stage x batch size) of a split model."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure per-stage latency per batch size; write the latency table",
                       description="Time every stage of a split model (and the whole graph) with onnxruntime at "
                                   "each batch size: median of --repeat runs after --warmup runs. Writes the "
                                   "latency table the scheduler reads (sizes in between are interpolated "
                                   "linearly by the table) and a batch-scaling plot.")
    p.add_argument("dir", type=Path, metavar="DIR", help="directory written by `lazybatch split`")
    p.add_argument("--batch-sizes", default="1,2,4,...,64",
                   help="measured sizes: '1,2,4,...,64' (default), '1,8,32', or '1-16' for every size")
    p.add_argument("--provider", default="CPUExecutionProvider",
                   help="onnxruntime execution provider, e.g. CPUExecutionProvider or CUDAExecutionProvider")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per stage and batch size (default 2)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs; the median is kept (default 5)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = its default)")
    p.add_argument("--global-thread-pool", action="store_true",
                   help="one onnxruntime intra-op pool shared by all the stages, as the Triton backend runs them "
                        "(default: a pool per stage session, spinning off, which measures each stage a little "
                        "slower; docs/onnx.md)")
    p.add_argument("--spin", action="store_true",
                   help="let idle threads of the per-session pools busy-wait (slow: the idle pools of the other "
                        "stages steal the cores the running stage needs); not with --global-thread-pool")
    p.add_argument("--inplace-residuals", choices=["true", "false"], default="true",
                   help="true (default): residual stages write their output over their shortcut input, as the "
                        "Triton backend runs them (its parameter of the same name; docs/onnx.md); false: plain runs")
    p.add_argument("--device-tensors", choices=["auto", "true", "false"], default="auto",
                   help="auto (default): stage tensors stay on the provider's device between stages for any "
                        "provider but the CPU's, as the Triton backend serves them (its parameter of the same name; "
                        "docs/deploy.md), so the table carries no host copies; true / false: always / never")
    p.add_argument("--out", type=Path, help="latency table path, .json or .csv (default DIR/latency.json)")
    p.add_argument("--plot", type=Path, help="plot path (default: next to the table, .png)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument("--no-whole", action="store_true", help="skip timing the whole graph (no overhead ratio)")
    p.add_argument("--length-histogram", type=Path,
                   help="output-length histogram (lazybatch.length_histogram/1) to record with a seq2seq table")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    import tempfile

    from lazybatch.batcher.errors import ConfigError
    from lazybatch.onnx_tools.profile import parse_batch_sizes, plot_table, profile_dir

    sizes = parse_batch_sizes(args.batch_sizes)
    if args.global_thread_pool:
        if args.spin:
            raise ConfigError("--spin applies to per-session pools; leave it out with --global-thread-pool (the "
                              "global pool spins as onnxruntime's default does)")
        from lazybatch.sessions.threads import use_global_thread_pool

        use_global_thread_pool(args.threads)
    out = args.out or args.dir / "latency.json"
    if not out.parent.is_dir():
        raise ConfigError(f"the folder of --out {str(out)!r} does not exist; create it first")
    table = profile_dir(args.dir, batch_sizes=sizes, provider=args.provider, warmup=args.warmup,
                        repeat=args.repeat, threads=args.threads, seed=args.seed, whole=not args.no_whole,
                        length_histogram=args.length_histogram, spinning=args.spin,
                        inplace=args.inplace_residuals == "true",
                        device_tensors=None if args.device_tensors == "auto" else args.device_tensors == "true")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        table.save(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"wrote {out}: {table.graph.n} stages x batch sizes {list(table.batch_sizes)}")
    if "overhead_ratio" in table.meta:
        ratios = ", ".join(f"b{b}: {r:.3f}" for b, r in zip(table.batch_sizes, table.meta["overhead_ratio"]))
        print(f"sum of stages / whole graph: {ratios}")
    if not args.no_plot:
        plot = args.plot or out.with_suffix(".png")
        try:
            plot_table(table, plot)
            print(f"wrote {plot}")
        except ConfigError as e:
            if args.plot:
                raise
            print(f"no plot: {e}")
    return 0
