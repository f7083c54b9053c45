"""``lazybatch load``: open-loop Poisson load (async gRPC) against served models at a rate or a sweep of rates."""

from __future__ import annotations

import argparse
from typing import Any


def _rates(text: str) -> list[float]:
    from lazybatch.batcher.errors import ConfigError

    try:
        rates = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise ConfigError(f"--rates expects numbers separated by commas, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise ConfigError(f"rates must be positive, got {text!r}")
    return rates


def add_together_arguments(p: Any, *, sla_default: str | None, how: str) -> None:
    """--sla-ms (one or per model), --together and --mix: `load` and `perf` take them alike."""
    p.add_argument("--sla-ms", default=sla_default, metavar="MS|MODEL=MS,...", help="SLA target sent with each "
                   "request as its sla_ms parameter (and, under `load`, used for the violation rate): one for every "
                   "model, or one per model, e.g. m1=20,m2=200" + (f" (default {sla_default})" if sla_default else ""))
    p.add_argument("--together", action="store_true", help=f"drive all the models at once (co-located load): each "
                   f"rate is the aggregate rate, split by --mix, {how}; a row per model and an aggregate row "
                   f"'(all)' per rate (default: the models one after the other, each at the full rate)")
    p.add_argument("--mix", default=None, metavar="MODEL=SHARE,...", help="--together: each model's share of the "
                   "aggregate rate, adding up to 1, e.g. m1=0.7,m2=0.1,m3=0.1,m4=0.1 (default equal shares)")


def register(sub: Any) -> None:
    p = sub.add_parser("load", help="open-loop Poisson load against served models; latency/SLA report")
    p.add_argument("models", nargs="+", help="model names on the server")
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC address (default %(default)s)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", type=float, help="requests per second")
    g.add_argument("--rates", help="a sweep, e.g. 5,10,20")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per rate and model (default 10)")
    add_together_arguments(p, sla_default="100", how="one open-loop Poisson stream per model, all started together")
    p.add_argument("--alone", action="store_true", help="--together: first measure each model alone at its own "
                   "share of the rate (the same arrivals), and report its p99 together / p99 alone")
    p.add_argument("--batch", type=int, default=1, help="samples per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="per-request client timeout in s")
    p.add_argument("--length-histogram", default=None, metavar="FILE", help="seq2seq models: source and output "
                   "lengths are drawn from this histogram (lazybatch.length_histogram/1 JSON or CSV; default: the "
                   "shipped WMT en-de one) with --seed")
    p.add_argument("--stop-at-eos", action="store_true", help="seq2seq models: stop at the end token (default: "
                   "decode exactly the drawn output length; random weights make no meaningful end token)")
    p.add_argument("--streaming", action="store_true", help="send each request on a gRPC stream and time its parts "
                   "(time to first token, time per output token), as perf_analyzer --streaming; on by itself for a "
                   "decoupled model, which answers only on a stream")
    p.add_argument("--class", dest="classes", action="append", default=None, metavar="NAME:SHARE:SLA_MS[:PRIORITY]",
                   help="a traffic class, repeated per class: SHARE of the requests (the shares add up to 1), each "
                   "with the class's SLA target (replaces --sla-ms; 'none' for no deadline) and request priority "
                   "(1 the most urgent level, 0 the model's default); the tables and files add each class's own "
                   "figures, e.g. --class interactive:0.2:20:1 --class bulk:0.8:200:2")
    p.add_argument("--capacity", action="store_true", help="search each model's capacity under its SLA, as MLPerf's "
                   "server scenario scores it: the highest Poisson rate whose window (--duration) is sustained (its "
                   "second half's median latency at most 1.2x its first's, 98%% of requests answered, at least 20 "
                   "answers) with its p99 within "
                   "--sla-ms; --rate is where the search starts (it doubles, halves, then bisects --steps times)")
    p.add_argument("--steps", type=int, default=5, help="--capacity: bisection windows after the bracket (default 5)")
    p.add_argument("--beside", default=None, metavar="MODEL=RATE", help="--capacity of one best-effort model while "
                   "MODEL, the latency-critical one, runs beside it at RATE requests/s in every window: the highest "
                   "best-effort rate at which both are sustained and MODEL's p99 stays within its SLA (--sla-ms MS, "
                   "MODEL's; or MODEL=MS,BEST_EFFORT=MS to send the best-effort model an SLA too)")
    p.add_argument("--out", default=None, help="write load.csv, load.json and load.png here, and report.md/.csv "
                   "with the rows of `lazybatch perf --out` the same folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.client.load import sweep
    from lazybatch.client.report import format_table, write_reports
    from lazybatch.client.together import parse_mix, parse_sla, sweep_together

    classes = None
    if args.classes:
        from lazybatch.traffic import parse_classes

        classes = parse_classes(args.classes)
    rates = [args.rate] if args.rate is not None else _rates(args.rates)
    if args.rate is not None and args.rate <= 0:
        raise ConfigError("--rate must be positive")
    if args.duration <= 0 or args.duration > 3600:
        raise ConfigError("--duration must be in (0, 3600] seconds")
    if (args.mix is not None or args.alone) and not args.together:
        raise ConfigError("--mix and --alone split an aggregate rate across models driven at once: add --together")
    if args.together and classes:
        raise ConfigError("--class is for one model's callers; with --together each model has its own --sla-ms")
    if args.beside and not args.capacity:
        raise ConfigError("--beside is part of a capacity search: add --capacity")
    if args.capacity:
        return capacity(args, classes)
    slas = parse_sla(args.sla_ms, args.models)
    shares = parse_mix(args.mix, args.models) if args.together else None

    def progress(r: Any, where: str = "") -> None:
        print(f"  {r.model}{f' ({where})' if where else ''} @ {r.offered_rate:g}/s: {r.ok}/{r.sent} ok, p50 {r.p50_ms:.1f} ms, "
              f"p99 {r.p99_ms:.1f} ms", flush=True)

    common = dict(batch=args.batch, timeout_s=args.timeout, length_histogram=args.length_histogram,
                  ignore_eos=not args.stop_at_eos, streaming=args.streaming)
    if shares is not None:
        results = sweep_together(args.url, shares, rates, args.duration, sla_ms=slas, seed=args.seed,
                                 alone=args.alone, progress=progress, **common)
    else:
        results = sweep(args.url, args.models, rates, args.duration, sla_ms=slas, seed=args.seed,
                        progress=progress, classes=classes, **common)
    print(format_table(results))
    if args.out:
        from lazybatch.client.report import write_combined

        for p in write_reports(results, args.out):
            print(f"wrote {p}")
        combined = write_combined(args.out)  # joins a perf.json of `lazybatch perf --out` the same folder
        if combined is not None:
            print(f"wrote {combined} (and report.csv: both load drivers side by side)")
    return 1 if all(r.ok == 0 for r in results) else 0


def capacity(args: argparse.Namespace, classes: Any) -> int:
    """``--capacity``: each model's rate search (client/capacity.py), one window at a time, its table at the end."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    from lazybatch.batcher.errors import ConfigError
    from lazybatch.client.capacity import MIN_REQUESTS, CapacitySearch
    from lazybatch.client.load import run_load
    from lazybatch.client.together import parse_sla, run_at_rates

    if args.rate is None:
        raise ConfigError("--capacity starts from --rate (requests/s), e.g. --capacity --rate 20 --sla-ms 50")
    if args.together or classes:
        raise ConfigError("--capacity searches one model at a time: drop --together and --class")
    if args.steps < 1 or args.steps > 20:
        raise ConfigError("--steps must be in 1..20")
    common = dict(batch=args.batch, timeout_s=args.timeout, length_histogram=args.length_histogram,
                  ignore_eos=not args.stop_at_eos, streaming=args.streaming)
    guard = _beside(args.beside, args.models) if args.beside else None
    if guard is None:
        slas = parse_sla(args.sla_ms, args.models)
    elif "=" in str(args.sla_ms):  # the SLA bound is the latency-critical model's; the other may send its own
        named = {pair.split("=")[0].strip() for pair in str(args.sla_ms).split(",")}
        slas = {args.models[0]: None, **parse_sla(args.sla_ms, [guard[0], *(m for m in args.models if m in named)])}
    else:
        slas = {guard[0]: parse_sla(args.sla_ms, [guard[0]])[guard[0]], args.models[0]: None}
    found = {}
    for model in args.models:
        judged = guard[0] if guard is not None else model
        sla = slas.get(judged)
        if sla is None:
            raise ConfigError(f"--capacity needs an SLA for {judged}: --sla-ms MS or {judged}=MS")
        # below MIN_REQUESTS a window cannot be judged: the search goes no lower than the rate that gives it that many
        search = CapacitySearch(sla_ms=sla, start_rate=args.rate, steps=args.steps,
                                min_rate=min(args.rate, MIN_REQUESTS / args.duration))
        beside = f" beside {guard[0]} at {guard[1]:g}/s" if guard is not None else ""
        print(f"{model}: capacity{beside} under a p99 of {sla:g} ms{f' for {judged}' if guard else ''}, windows of "
              f"{args.duration:g} s from {args.rate:g}/s", flush=True)
        rate = search.next_rate()
        while rate is not None:
            if guard is None:
                r = run_load(args.url, model, rate, args.duration, sla_ms=sla, seed=args.seed, **common)
                probe = search.record(rate, r)
            else:
                g, r = run_at_rates(args.url, {guard[0]: guard[1], model: rate}, args.duration, sla_ms=slas,
                                    seed=args.seed, **common)
                probe = search.record(rate, r, guarded=g)
            print(f"  {rate:.1f}/s: {probe.requests} requests, p99 {probe.p99_ms:.1f} ms: "
                  f"{'pass' if probe.passed else 'fail'} ({probe.why})", flush=True)
            rate = search.next_rate()
        print(search.table())
        found[model] = {"sla_ms": sla, "duration_s": args.duration,
                        "beside": {"model": guard[0], "rate": guard[1]} if guard is not None else None,
                        "capacity": search.best.rate if search.best else None,
                        "probes": [asdict(p) for p in search.probes]}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "capacity.json").write_text(json.dumps(found, indent=1))
        print(f"wrote {out / 'capacity.json'}")
    return 0 if all(v["capacity"] is not None for v in found.values()) else 1


def _beside(text: str, models: list[str]) -> tuple[str, float]:
    """``--beside MODEL=RATE``: the latency-critical model and its fixed rate."""
    from lazybatch.batcher.errors import ConfigError

    name, _, rate = text.partition("=")
    try:
        r = float(rate)
    except ValueError:
        r = -1.0
    if not name or r <= 0:
        raise ConfigError(f"--beside expects MODEL=RATE with a positive rate in requests/s, got {text!r}")
    if len(models) != 1 or name in models:
        raise ConfigError("--beside searches one best-effort model's capacity: name exactly one other model")
    return name, r
