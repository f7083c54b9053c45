"""``lazybatch perf``: NVIDIA perf_analyzer (Poisson request rates, --async) against served models."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("perf", help="run perf_analyzer (installed on first use) with a Poisson request distribution")
    p.add_argument("models", nargs="*", help="model names on the server")
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC address (default %(default)s)")
    p.add_argument("--rates", default="10", help="request rates, one or evenly spaced (5,10,15) (default 10)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--measurement-ms", type=int, default=4000, help="perf_analyzer measurement window")
    from lazybatch.commands.load import add_together_arguments

    add_together_arguments(p, sla_default=None, how="one perf_analyzer per model, all started at once and waited "
                           "for together")
    p.add_argument("--stability-percentage", type=float, default=50.0, help="perf_analyzer's stability threshold "
                   "(raise it on a busy machine, where windows vary more)")
    p.add_argument("--max-trials", type=int, default=6)
    p.add_argument("--perf-analyzer", default=None, help="a perf_analyzer binary (default: the venv's, installed "
                   "on first use from the tritonclient 2.41.0 wheel)")
    p.add_argument("--install", action="store_true", help="(re)install perf_analyzer and exit")
    p.add_argument("--length-histogram", default=None, metavar="FILE", help="seq2seq models: source/output lengths "
                   "of the generated --input-data are drawn from this histogram (default: the shipped one)")
    p.add_argument("--input-data", default=None, metavar="zero|random|FILE", help="perf_analyzer's --input-data "
                   "(default: its random data; for seq2seq models valid requests generated here)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2,...", help="perf_analyzer's --shape "
                   "for an input with dynamic dims (repeatable; default: the model's example_dims, which `repo add` "
                   "writes from the split's --input-shape)")
    p.add_argument("--seed", type=int, default=0, help="seq2seq models: seed of the generated input data")
    p.add_argument("--poisson-seed", type=int, default=None, metavar="N", help="draw the Poisson arrivals here "
                   "with seed N and give them to perf_analyzer as --request-intervals, one run per rate (default: "
                   "perf_analyzer's own Poisson schedule, which replays one fixed sequence on every run: repeated "
                   "runs are the same arrivals, and a few seconds of it offer 0.6-0.9 of the asked rate)")
    p.add_argument("--streaming", action="store_true", help="perf_analyzer --streaming (gRPC streams); on by itself "
                   "for a decoupled model, which answers only on a stream; adds time to first token and per output "
                   "token, from its --profile-export-file")
    p.add_argument("--out", default="lazybatch-results/perf", help="CSV/JSON/logs go here (default %(default)s); "
                   "with the folder of a `lazybatch load --out`, report.md/.csv hold both drivers' rows")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch import perf
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.client.load import AGGREGATE
    from lazybatch.client.report import shares_in_groups
    from lazybatch.client.together import parse_mix, parse_sla
    from lazybatch.commands.load import _rates

    if args.install:
        print(f"installed {perf.install(force=True)}")
        return 0
    if not args.models:
        raise ConfigError("name at least one model (or pass --install)")
    if args.mix is not None and not args.together:
        raise ConfigError("--mix splits an aggregate rate across models driven at once: add --together")
    slas = parse_sla(args.sla_ms, args.models)
    shares = parse_mix(args.mix, args.models) if args.together else None
    rates = _rates(args.rates)
    binary = perf.find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        if args.perf_analyzer:
            raise ConfigError(f"no perf_analyzer at {args.perf_analyzer}")
        print("perf_analyzer not found: installing it from the tritonclient 2.41.0 wheel ...", flush=True)
        binary = perf.install()
    out = Path(args.out)
    own = {}
    for m in args.models:
        data = args.input_data or _seq2seq_input_data(args, m, out)
        from_file = data not in (None, "zero", "random")  # a JSON file of inputs gives each its shape
        own[m] = {"sla_ms": slas[m], "input_data": data,
                  "extra": (["--streaming"] if args.streaming or _decoupled(args.url, m) else [])
                  + ([] if from_file else _shape_arguments(args.url, m, args.shape))}
    common = dict(batch=args.batch, measurement_ms=args.measurement_ms, max_trials=args.max_trials,
                  stability_percentage=args.stability_percentage, poisson_seed=args.poisson_seed)
    all_rows = []
    if shares is not None:
        if args.poisson_seed is None and len(set(shares.values())) < len(shares):
            print("note: perf_analyzer's own Poisson schedule is one fixed sequence scaled by the rate, so models at "
                  "equal rates get the same arrival times; --poisson-seed N gives each its own", flush=True)
        all_rows, _ = perf.run_together(binary, shares, args.url, rates, out, per_model=own, **common)
    for model in args.models if shares is None else ():
        rows, _ = perf.run(binary, model, args.url, rates, out, **own[model], **common)
        all_rows += rows
    print(f"{'model':<22} {'rate/s':>7} {'infer/s':>8} {'avg ms':>8} {'p50':>8} {'p90':>8} {'p99':>8} "
          f"{'queue':>7} {'compute':>8}")
    for r in all_rows:
        if r.model == AGGREGATE:  # models driven together: their pooled row under them
            print("-" * 93)
        print(f"{r.model:<22} {r.request_rate:>7.1f} {r.throughput:>8.1f} {r.avg_ms:>8.2f} {r.p50_ms:>8.2f} "
              f"{r.p90_ms:>8.2f} {r.p99_ms:>8.2f} {r.server_queue_ms:>7.2f} {r.server_compute_ms:>8.2f}")
    streamed = [r for r in all_rows if r.streamed_requests]
    if streamed:  # perf_analyzer --streaming: its latency is the whole stream; the first token's from its export
        print(f"\n{'model':<22} {'rate/s':>7} {'TTFT avg':>9} {'p50':>8} {'p99':>8} {'TPOT avg':>9} {'p99':>8}")
        for r in streamed:
            print(f"{r.model:<22} {r.request_rate:>7.1f} {r.ttft_avg_ms:>9.2f} {r.ttft_p50_ms:>8.2f} "
                  f"{r.ttft_p99_ms:>8.2f} {r.tpot_avg_ms:>9.2f} {r.tpot_p99_ms:>8.2f}")
    if shares is not None:  # every request answered once: perf_analyzer's own export, per model
        print(f"\n{'together':<22} {'rate/s':>7} {'share':>6} {'requests':>9} {'unanswered':>10} {'dup':>5}")
        share = shares_in_groups([r.model for r in all_rows], [r.request_rate for r in all_rows])
        for r, s in zip(all_rows, share):
            print(f"{r.model:<22} {r.request_rate:>7.1f} {s:>6.2f} {r.requests:>9d} "
                  f"{r.unanswered_requests:>10d} {r.duplicated_requests:>5d}")
    (out / "perf.json").write_text(json.dumps([r.row() for r in all_rows], indent=1))
    print(f"wrote {out / 'perf.json'} and perf_<model>.csv/.log"
          + (" (streamed: perf_<model>_export.json, perf_analyzer's timestamps)" if streamed else ""))
    from lazybatch.client.report import write_combined

    combined = write_combined(out)  # joins a load.json of `lazybatch load --out` the same folder
    if combined is not None:
        print(f"wrote {combined} (and report.csv: both load drivers side by side)")
    return 0


def _shape_arguments(url: str, model: str, given: list[str]) -> list[str]:
    """perf_analyzer's ``--shape`` for each input with a dynamic dim: the user's, else the model's example_dims
    (perf_analyzer refuses a dynamic input without one); a clear error where neither says a size."""
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.client.api import Client
    from lazybatch.formats.example_dims import format_example_dims, parse_example_dims

    try:
        explicit = parse_example_dims(";".join(given))
    except ValueError as e:
        raise ConfigError(f"--shape: {e}", field="--shape") from None
    with Client(url) as c:
        dynamic = [t for t in c.model_info(model).inputs if any(d < 0 for d in t.shape[1:])]
        examples = c.example_dims(model) if dynamic else {}
    out = []
    for t in dynamic:
        dims = explicit.get(t.name, examples.get(t.name))
        if dims is None:
            raise ConfigError(f"{model}: input {t.name!r} has dynamic dims {list(t.shape[1:])} and the model declares "
                              f"no example_dims: pass --shape {t.name}:D1,D2,... (one size per dim)", field="--shape")
        out += ["--shape", format_example_dims({t.name: dims})]
    return out


def _decoupled(url: str, model: str) -> bool:
    """Whether the model answers on streams only (model_transaction_policy { decoupled: true })."""
    from lazybatch.client.api import Client

    with Client(url) as c:
        return c.is_decoupled(model)


def _seq2seq_input_data(args: argparse.Namespace, model: str, out: Path) -> str | None:
    """None (perf_analyzer's own default data) for ordinary models; for a seq2seq model a JSON of valid requests
    (client/seq2seq.py): random token ids would fall outside the vocabulary."""
    from lazybatch.client.api import Client
    from lazybatch.client.seq2seq import info_from_parameters, perf_input_data

    with Client(args.url) as c:
        info = info_from_parameters(c.model_parameters(model))
    if info is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"input_{model}.json"
    path.write_text(json.dumps(perf_input_data(info, seed=args.seed, histogram=args.length_histogram)))
    return str(path)
