"""``lazybatch repo add``: a Triton model directory for an ONNX model under a batching policy."""

from __future__ import annotations

import argparse
from typing import Any

from lazybatch.backend.parameters_docs import parameters_help
from lazybatch.batcher.policies.registry import DEFAULT_POLICY, policy_choices, policy_help


def register(sub: Any) -> None:
    p = sub.add_parser("repo", help="build model directories for a Triton model repository")
    rsub = p.add_subparsers(dest="repo_command", metavar="SUBCOMMAND", required=True)
    a = rsub.add_parser("add", help="add MODEL.onnx to a model repository under a batching policy",
                        description="Split MODEL.onnx into stages, profile them into a latency table and write "
                        "NAME/config.pbtxt + NAME/1/{model.py,model.onnx,stages/,latency.json}.",
                        epilog=parameters_help())
    a.add_argument("model", nargs="?", default=None, help="the whole-graph ONNX model (batch dimension symbolic)")
    a.add_argument("--repository", "--model-repository", dest="repository", default="model_repository")
    a.add_argument("--name", default=None, help="model name (default: the ONNX file's stem + _ + policy)")
    a.add_argument("--policy", default=DEFAULT_POLICY, help=f"{policy_choices(triton=True)} (default "
                   f"{DEFAULT_POLICY}; parameters as policy:key=value,...). {policy_help(triton=True)}")
    a.add_argument("--sla-ms", type=float, default=100.0, help="default SLA target per request (default 100)")
    a.add_argument("--max-batch-size", type=int, default=16)
    a.add_argument("--scheduler-max-batch-size", type=int, default=None, help="largest sub-batch the scheduler "
                   "forms (default: --max-batch-size); lower it where batching does not pay on the device")
    a.add_argument("--stages", default=None, help="an existing stage directory (from `lazybatch split`) instead of "
                   "splitting MODEL.onnx here")
    a.add_argument("--max-stages", type=int, default=None, help="merge cut points down to at most this many stages")
    a.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...", default=None,
                   help="size per sample (no batch) of an input with dynamic dimensions besides the batch, e.g. "
                        "images=3,640,640: what the split and the profile run the model at (as `lazybatch split "
                        "--input-shape`); the stages and config.pbtxt keep those dimensions -1")
    a.add_argument("--latency-table", default=None, help="an existing latency table (from `lazybatch profile`) "
                   "instead of profiling here")
    a.add_argument("--profile-reps", type=int, default=3)
    a.add_argument("--execution-provider", default="auto", choices=("auto", "cpu", "cuda"))
    a.add_argument("--intra-op-threads", type=int, default=0)
    a.add_argument("--reject-nan", action="store_true", help="refuse requests whose float inputs hold NaN/Inf "
                   "(INVALID_ARG); by default they are served, as by Triton's own backends")
    a.add_argument("--allow-nan", action="store_true", help=argparse.SUPPRESS)  # NaN/Inf are accepted by default now; kept so old scripts still parse
    a.add_argument("--max-queue-size", type=int, default=0, help="most samples the scheduler holds; more are "
                   "rejected UNAVAILABLE at once (Triton's max_queue_size; default 0: unbounded)")
    a.add_argument("--timeout-action", type=str.upper, choices=("REJECT", "DELAY"), default=None,
                   help="REJECT: refuse requests whose deadline cannot be met; DELAY: serve them late (default)")
    a.add_argument("--decoupled", action="store_true", help="seq2seq and decoder models: stream the tokens as they "
                   "are made (model_transaction_policy { decoupled: true }; clients use gRPC streaming, e.g. "
                   "`lazybatch load --streaming`, perf_analyzer --streaming)")
    a.add_argument("--stream-interval-tokens", type=int, default=None, help="with --decoupled: a response every N "
                   "new tokens of a row (default 1)")
    a.add_argument("--priority-levels", type=int, default=0, help="request priority levels (Triton's "
                   "dynamic_batching.priority_levels; 1 is the most urgent): Triton's queue and the scheduler order "
                   "by them, and eager lets a more urgent class preempt at stage boundaries (default 0: one level)")
    a.add_argument("--default-priority-level", type=int, default=None, help="the level of a request that sends no "
                   "priority (default: the least urgent)")
    a.add_argument("--priority-queue-timeout-us", action="append", default=None, metavar="LEVEL=US",
                   help="triton:<us> models: Triton's queue rejects a request of LEVEL still queued after US "
                   "microseconds (priority_queue_policy, timeout_action REJECT); repeat per level")
    a.add_argument("--force", action="store_true", help="replace an existing model directory")
    a.add_argument("--executor", default="onnxruntime", choices=("onnxruntime", "npu"), help="npu: outputs from "
                   "onnxruntime, each stage released at its modelled NPU time; the latency table is the NPU "
                   "model's (docs/npu.md, simulated deployment)")
    a.add_argument("--npu-time-scale", type=float, default=1.0, help="executor npu: run k times slower than the "
                   "NPU, so that NPU time dominates the CPU's (1)")
    a.add_argument("--npu-config", default=None, help="executor npu: NPU configuration JSON (default Table I)")
    a.set_defaults(func=run_add)
    d = rsub.add_parser("default", help="build the shipped comparison repository: a model under lazy, Triton's "
                        "dynamic batcher (0/5000/20000 us) and serial")
    d.add_argument("--repository", "--model-repository", dest="repository", default="model_repository")
    d.add_argument("--model", default="resnet50",
                   choices=("resnet50", "mlp", "bert", "tiny", "gnmt", "transformer", "mobilenet", "lm"),
                   help="resnet50 (batching barely pays on a CPU), mlp (8 x 2048 MatMul layers: batching pays), "
                   "bert (BERT-base, sequence 32), gnmt (GNMT-like LSTM seq2seq), transformer (Transformer base, "
                   "6+6 layers; both under graph:0/5/20 instead of Triton's batcher), mobilenet (MobileNet-v1), lm "
                   "(GPT-2-like decoder-only LM, chat-like lengths; under Triton's own batcher too, each batch decoded "
                   "to its end) or tiny (4 x 64 MLP, for tests); model "
                   "names are <model>_<policy>")
    d.add_argument("--max-batch-size", type=int, default=None,
                   help="default 8 (resnet50, bert, tiny, gnmt, transformer, mobilenet), 16 (mlp, lm)")
    d.add_argument("--sla-ms", type=float, default=None,
                   help="default SLA: 100 ms (resnet50, mobilenet), 10 ms (mlp), 300 ms (bert), 50 ms (tiny), "
                   "5000 ms (gnmt, transformer, lm)")
    d.add_argument("--max-stages", type=int, default=20)
    d.add_argument("--force", action="store_true", help="rebuild everything (model, stages, latency table)")
    d.add_argument("--no-npu-timing", action="store_true", help="leave out the npu_timing query model")
    d.add_argument("--pair", action="store_true", help="also the quickstart's co-located pair: mlp and resnet50 "
                   "under lazybatch's defaults (eager, the CPU share on) and under Triton's batcher at 0/5000 us "
                   "(<kind>_eager_shared, <kind>_triton_0us, <kind>_triton_5000us)")
    d.add_argument("--decoupled", action="store_true", help="gnmt, transformer, lm: every model streams its tokens "
                   "(model_transaction_policy { decoupled: true }; see `repo add --decoupled`)")
    d.set_defaults(func=run_default)
    n = rsub.add_parser("npu-timing", help="add the npu_timing model: NPU latency queries over gRPC (docs/npu.md)")
    n.add_argument("--repository", "--model-repository", dest="repository", default="model_repository")
    n.add_argument("--name", default="npu_timing")
    n.add_argument("--npu-config", default=None, help="NPU configuration JSON (`lazybatch npu config` prints one); "
                   "default: the LazyBatching paper's Table I")
    n.add_argument("--force", action="store_true", help="replace an existing model directory")
    n.set_defaults(func=run_npu_timing)


def _priority_args(args: argparse.Namespace) -> dict[str, Any]:
    """--priority-levels, --default-priority-level and --priority-queue-timeout-us as add_model's arguments."""
    from lazybatch.batcher.errors import ConfigError

    levels = args.priority_levels
    if not levels:
        if args.default_priority_level is not None or args.priority_queue_timeout_us:
            raise ConfigError("--default-priority-level and --priority-queue-timeout-us need --priority-levels")
        return {}
    timeouts: dict[int, int] = {}
    for item in args.priority_queue_timeout_us or ():
        level, sep, us = item.partition("=")
        try:
            if not sep:
                raise ValueError
            timeouts[int(level)] = int(float(us))
        except ValueError:
            raise ConfigError(f"--priority-queue-timeout-us expects LEVEL=US, e.g. 1=40000, got {item!r}") from None
    default = args.default_priority_level if args.default_priority_level is not None else levels
    return {"priority_levels": levels, "default_priority_level": default, "priority_timeouts_us": timeouts or None}


def run_add(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lazybatch.batcher.errors import ConfigError
    from lazybatch.repo import add_model

    if args.model is None and args.stages is None:
        raise ConfigError("give MODEL.onnx or --stages DIR")
    stem = Path(args.model or args.stages).stem
    name = args.name or f"{stem}_{args.policy.split(':')[0].lower()}"
    add = add_model
    if args.executor == "npu":
        from lazybatch.npu_repo import add_npu_model as add

        if args.latency_table:
            raise ConfigError("--executor npu computes the NPU latency table itself; leave out --latency-table")
        extra = {"npu_time_scale": args.npu_time_scale, "npu_config": args.npu_config}
        if args.input_shape:
            raise ConfigError("--input-shape is for --executor onnxruntime; with npu, split with `lazybatch split "
                              "--input-shape` and pass --stages")
    else:
        from lazybatch.onnx_tools.probe import parse_input_shapes

        extra = {"latency_table": args.latency_table, "input_shapes": parse_input_shapes(args.input_shape),
                 **_priority_args(args)}
    mdir = add(args.model, args.repository, name=name, policy=args.policy, sla_ms=args.sla_ms,
               max_batch_size=args.max_batch_size, stages=args.stages, max_stages=args.max_stages,
               **extra, profile_reps=args.profile_reps,
               execution_provider=args.execution_provider, intra_op_threads=args.intra_op_threads,
               allow_nan=not args.reject_nan, scheduler_max_batch_size=args.scheduler_max_batch_size,
               force=args.force, max_queue_size=args.max_queue_size, timeout_action=args.timeout_action,
               **({"decoupled": True, "stream_interval_tokens": args.stream_interval_tokens} if args.decoupled
                  else {"stream_interval_tokens": args.stream_interval_tokens} if args.stream_interval_tokens
                  else {}))
    print(f"added {mdir}")
    print((mdir / "config.pbtxt").read_text())
    return 0


def run_default(args: argparse.Namespace) -> int:
    from lazybatch.shipped import build_default_repository

    repo = build_default_repository(args.repository, kind=args.model, max_batch_size=args.max_batch_size,
                                    sla_ms=args.sla_ms,
                                    max_stages=args.max_stages, force=args.force,
                                    seq2seq_baselines=args.model != "lm",  # lm: Triton's own batcher, not graph:N
                                    decoupled=args.decoupled)
    if args.pair:
        from lazybatch.shipped import build_pair_repository

        build_pair_repository(repo, force=args.force, built=(args.model,))
    if not args.no_npu_timing:
        from lazybatch.npu_repo import add_npu_timing

        if not (repo / "npu_timing").exists() or args.force:
            add_npu_timing(repo, force=True)
            print("npu_timing: NPU latency queries (lazybatch npu query --model <name>)")
    print(f"model repository ready: {repo} (serve it with `lazybatch serve --model-repository {repo}`)")
    return 0


def run_npu_timing(args: argparse.Namespace) -> int:
    from lazybatch.npu_repo import add_npu_timing

    mdir = add_npu_timing(args.repository, name=args.name, npu_config=args.npu_config, force=args.force)
    print(f"added {mdir}: query it with `lazybatch npu query --model <a model of the repository> --batch 1,8`")
    return 0
