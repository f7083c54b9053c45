"""``lazybatch perf``: NVIDIA perf_analyzer (Poisson request rates, --async) against served models."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("perf", help="run perf_analyzer (installed on first use) with a Poisson request distribution")
    p.add_argument("models", nargs="*", help="model names on the server")
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC address (default %(default)s)")
    p.add_argument("--rates", default="10", help="request rates, one or evenly spaced (5,10,15) (default 10)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--measurement-ms", type=int, default=4000, help="perf_analyzer measurement window")
    p.add_argument("--sla-ms", type=float, default=None, help="send sla_ms as a request parameter")
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
    from lazybatch.commands.load import _rates

    if args.install:
        print(f"installed {perf.install(force=True)}")
        return 0
    if not args.models:
        raise ConfigError("name at least one model (or pass --install)")
    binary = perf.find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        if args.perf_analyzer:
            raise ConfigError(f"no perf_analyzer at {args.perf_analyzer}")
        print("perf_analyzer not found: installing it from the tritonclient 2.41.0 wheel ...", flush=True)
        binary = perf.install()
    rates = _rates(args.rates)
    out = Path(args.out)
    all_rows = []
    for model in args.models:
        rows, _ = perf.run(binary, model, args.url, rates, out, batch=args.batch,
                           measurement_ms=args.measurement_ms, sla_ms=args.sla_ms,
                           stability_percentage=args.stability_percentage, max_trials=args.max_trials,
                           input_data=args.input_data or _seq2seq_input_data(args, model, out),
                           extra=["--streaming"] if args.streaming or _decoupled(args.url, model) else [],
                           poisson_seed=args.poisson_seed)
        all_rows += rows
    print(f"{'model':<22} {'rate/s':>7} {'infer/s':>8} {'avg ms':>8} {'p50':>8} {'p90':>8} {'p99':>8} "
          f"{'queue':>7} {'compute':>8}")
    for r in all_rows:
        print(f"{r.model:<22} {r.request_rate:>7.1f} {r.throughput:>8.1f} {r.avg_ms:>8.2f} {r.p50_ms:>8.2f} "
              f"{r.p90_ms:>8.2f} {r.p99_ms:>8.2f} {r.server_queue_ms:>7.2f} {r.server_compute_ms:>8.2f}")
    streamed = [r for r in all_rows if r.streamed_requests]
    if streamed:  # perf_analyzer --streaming: its latency is the whole stream; the first token's from its export
        print(f"\n{'model':<22} {'rate/s':>7} {'TTFT avg':>9} {'p50':>8} {'p99':>8} {'TPOT avg':>9} {'p99':>8}")
        for r in streamed:
            print(f"{r.model:<22} {r.request_rate:>7.1f} {r.ttft_avg_ms:>9.2f} {r.ttft_p50_ms:>8.2f} "
                  f"{r.ttft_p99_ms:>8.2f} {r.tpot_avg_ms:>9.2f} {r.tpot_p99_ms:>8.2f}")
    (out / "perf.json").write_text(json.dumps([asdict(r) for r in all_rows], indent=1))
    print(f"wrote {out / 'perf.json'} and perf_<model>.csv/.log"
          + (" (streamed: perf_<model>_export.json, perf_analyzer's timestamps)" if streamed else ""))
    from lazybatch.client.report import write_combined

    combined = write_combined(out)  # joins a load.json of `lazybatch load --out` the same folder
    if combined is not None:
        print(f"wrote {combined} (and report.csv: both load drivers side by side)")
    return 0


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
