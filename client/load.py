"""An open-loop Poisson load generator over async gRPC, and its report (table, CSV/JSON, latency-vs-load plot).

Open loop: requests are sent at their scheduled Poisson arrival times whether or not earlier ones have been
answered, as real independent clients would; a closed loop would hide queueing delay. Every run is bounded in time
(``duration_s`` plus a drain timeout) and in count (``max_requests``), and stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.traffic import assign

from .api import make_inputs, request_parameters


@dataclass
class LoadResult:
    """One model at one offered rate."""

    model: str
    offered_rate: float  # requests/s asked for
    duration_s: float
    sla_ms: float | None
    batch: int
    sent: int = 0
    ok: int = 0
    errors: int = 0
    send_rate: float = 0.0  # requests/s actually sent
    throughput: float = 0.0  # successful requests/s over the run
    avg_ms: float = math.nan
    p50_ms: float = math.nan
    p90_ms: float = math.nan
    p99_ms: float = math.nan
    max_ms: float = math.nan
    sla_violation_rate: float = math.nan  # (late + failed) / sent; failed: errors and requests never answered
    lost: int = 0  # requests with no answer by the drain timeout
    duplicated: int = 0  # requests answered more than once
    p99_alone_ms: float = math.nan  # `load --together --alone`: this model's p99 at its own rate with nothing beside it
    error_kinds: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    # per request, in send order: (scheduled send offset s, latency ms or NaN, answered ok); time series need these
    records: list[tuple[float, float, bool]] = field(default_factory=list, repr=False)
    start_unix: float = 0.0  # wall-clock time of offset 0 (to line requests up with server-side logs)
    # streamed (decoupled) models only: time to first token and time per output token after it (client/stream.py)
    streaming: bool = False
    tokens: int = 0  # output tokens received in successful answers
    ttft_avg_ms: float = math.nan
    ttft_p50_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    tpot_avg_ms: float = math.nan
    tpot_p99_ms: float = math.nan
    # traffic classes (lazybatch/traffic.py): name -> the class's own figures (class_summary); sla_violation_rate
    # above then counts each request against its own class's SLA
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("latencies_ms")
        d.pop("records")
        d["error_kinds"] = json.dumps(self.error_kinds)
        d["classes"] = json.dumps(self.classes)
        return d


def poisson_schedule(rate: float, duration_s: float, seed: int, max_requests: int) -> list[float]:
    """Send offsets (s) of a Poisson process of ``rate``/s over ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        return []
    rng = np.random.default_rng(seed)
    out: list[float] = []
    t = float(rng.exponential(1.0 / rate))
    while t < duration_s and len(out) < max_requests:
        out.append(t)
        t += float(rng.exponential(1.0 / rate))
    return out


def summarize(res: LoadResult, latencies_s: list[float], ok_flags: list[bool], errors: list[str],
              start: float, last_done: float) -> LoadResult:
    """Throughput counts from the start of the load to the last answer (at least the load's duration), so that a
    light load reports about its offered rate, and an overload the rate the server really sustained."""
    lat = np.array([l for l, ok in zip(latencies_s, ok_flags) if ok]) * 1e3
    res.ok = int(lat.size)
    res.errors = len(errors)
    for e in errors:
        key = e.split("\n")[0][:120]
        res.error_kinds[key] = res.error_kinds.get(key, 0) + 1
    span = max(last_done - start, res.duration_s, 1e-9)
    res.throughput = res.ok / span if res.sent else 0.0
    if lat.size:
        res.avg_ms = float(lat.mean())
        res.p50_ms, res.p90_ms, res.p99_ms = (float(v) for v in np.percentile(lat, [50, 90, 99]))
        res.max_ms = float(lat.max())
        res.latencies_ms = [float(v) for v in lat]
    if res.sent:
        late = int((lat > res.sla_ms).sum()) if res.sla_ms is not None else 0
        res.sla_violation_rate = (late + res.sent - res.ok) / res.sent  # failed: errors and lost alike
    return res


def class_summary(latencies_s: Sequence[float], ok_flags: Sequence[bool], which: Sequence[int],
                  classes: Sequence[Any], span_s: float) -> tuple[dict[str, dict[str, Any]], float]:
    """Per traffic class: requests sent, answered, average/p50/p99 latency (ms, answered ones), SLA violation rate
    ((late + failed) / sent, against the class's SLA) and throughput (answered per second over ``span_s``). Also
    the violation rate over all requests, each against its own class's SLA."""
    out: dict[str, dict[str, Any]] = {}
    late_all = 0
    for k, c in enumerate(classes):
        idx = [i for i, w in enumerate(which) if w == k]
        lat = np.array([latencies_s[i] for i in idx if ok_flags[i]]) * 1e3
        late = int((lat > c.sla_ms).sum()) if c.sla_ms is not None else 0
        failed = len(idx) - int(lat.size)
        late_all += late + failed
        out[c.name] = {"sla_ms": c.sla_ms, "priority": c.priority, "sent": len(idx), "ok": int(lat.size),
                       "avg_ms": float(lat.mean()) if lat.size else math.nan,
                       "p50_ms": float(np.percentile(lat, 50)) if lat.size else math.nan,
                       "p99_ms": float(np.percentile(lat, 99)) if lat.size else math.nan,
                       "sla_violation_rate": (late + failed) / len(idx) if idx else math.nan,
                       "throughput": lat.size / span_s if span_s > 0 else math.nan}
    return out, (late_all / len(which) if len(which) else math.nan)


def schedule_from_rates(trace: Sequence[tuple[float, float]], duration_s: float, seed: int = 0) -> list[float]:
    """Send offsets (s) of a Poisson process whose rate follows a piecewise-constant ``(start_s, rate)`` trace (e.g.
    ``lazybatch.simulator.workload.rate_trace``), over ``duration_s``: the time-varying open loop."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for i, (t0, rate) in enumerate(trace):
        t1 = trace[i + 1][0] if i + 1 < len(trace) else duration_s
        t1 = min(t1, duration_s)
        if rate <= 0 or t1 <= t0:
            continue
        t = t0 + float(rng.exponential(1.0 / rate))
        while t < t1:
            out.append(t)
            t += float(rng.exponential(1.0 / rate))
    return out


async def _run_one_rate(url: str, model: str, rate: float, duration_s: float, *, sla_ms: float | None,
                        batch: int, seed: int, max_requests: int, timeout_s: float,
                        send_sla: bool, length_histogram: str | None = None, ignore_eos: bool = True,
                        offsets: Sequence[float] | None = None, streaming: bool = False,
                        classes: Sequence[Any] | None = None, start_gate: Any = None) -> LoadResult:
    """One model's open loop. ``start_gate``: awaited after the warm-up, before the first request (several models
    driven at once start their schedules together, client/together.py)."""
    import tritonclient.grpc as grpcmod
    import tritonclient.grpc.aio as aio

    from .stream import StreamClient, Streamed

    res = LoadResult(model, rate, duration_s, sla_ms, batch, streaming=streaming)
    client = aio.InferenceServerClient(url)
    streamer = StreamClient(url) if streaming else None
    try:
        from lazybatch.formats.example_dims import feed_shape, parse_example_dims

        from .api import DATATYPES
        from .seq2seq import grpc_parameters, info_from_parameters

        md = await client.get_model_metadata(model)
        config = await client.get_model_config(model)
        model_params = grpc_parameters(config)
        examples = parse_example_dims(model_params.get("example_dims"))  # sizes for dynamic dims the model accepts
        rng = np.random.default_rng(seed)
        feeds = {}
        for t in md.inputs:
            shape = (batch, *feed_shape([int(d) for d in list(t.shape)[1:]], examples.get(t.name)))
            dt = DATATYPES[t.datatype]
            feeds[t.name] = (rng.standard_normal(shape) if dt.kind == "f" else rng.integers(0, 10, shape)).astype(dt)
        params = request_parameters(sla_ms if send_sla else None)
        s2s = info_from_parameters(model_params)
        if getattr(config, "config", config).model_transaction_policy.decoupled and streamer is None:  # it answers only on a stream
            res.streaming, streamer = True, StreamClient(url)
        if offsets is None:
            offsets = poisson_schedule(rate, duration_s, seed, max_requests)
        else:
            offsets = sorted(offsets)[:max_requests]
        per_request: list[Any] = []
        # traffic classes: each request's class drawn with the shares (seeded); its SLA and priority travel as
        # lazybatch's request parameters and as Triton's own request priority (for Triton's dynamic batcher)
        which = assign(classes, len(offsets), seed) if classes else []
        class_params = [request_parameters(c.sla_ms if send_sla else None, priority=c.priority or None)
                        for c in classes or ()]
        if s2s is not None:  # seq2seq: source and output lengths drawn from the histogram, one pair per request
            from .seq2seq import LengthSampler, make_request

            sampler = LengthSampler(s2s, length_histogram, seed)
            for _ in range(len(offsets)):
                src_len, out_len = sampler.draw()
                per_request.append(make_request(rng, s2s, src_len, out_len, batch=batch, ignore_eos=ignore_eos))
            feeds = make_request(rng, s2s, 1, 1, batch=batch)  # the warm-up: one source token, one output token
        # one warm-up request, not counted
        try:
            if streamer is not None:
                await streamer.generate(model, feeds, sla_ms=sla_ms if send_sla else None, timeout_s=timeout_s)
            else:
                await client.infer(model, make_inputs(grpcmod, feeds), parameters=params or None,
                                   client_timeout=timeout_s)
        except Exception:
            pass
        if start_gate is not None:
            await start_gate.wait()
        latencies: list[float] = [math.nan] * len(offsets)
        answers = [0] * len(offsets)  # answers per request: exactly one each, or it is lost or duplicated
        ok_flags = [False] * len(offsets)
        errors: list[str] = []
        done_times: list[float] = []
        streamed: list[Streamed | None] = [None] * len(offsets)

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            inputs = per_request[i] if per_request else feeds
            mine = classes[which[i]] if classes else None
            if streamer is not None:
                s = streamed[i] = await streamer.generate(
                    model, inputs, sla_ms=(mine.sla_ms if mine is not None else sla_ms) if send_sla else None,
                    timeout_s=timeout_s)
                ok_flags[i] = s.ok
                if s.error is not None:
                    errors.append(s.error)
            else:
                try:
                    if mine is not None:
                        await client.infer(model, make_inputs(grpcmod, inputs), priority=mine.priority,
                                           parameters=class_params[which[i]] or None, client_timeout=timeout_s)
                    else:
                        await client.infer(model, make_inputs(grpcmod, inputs), parameters=params or None,
                                           client_timeout=timeout_s)
                    ok_flags[i] = True
                except Exception as e:  # counted, reported by kind
                    m = getattr(e, "message", None)
                    errors.append(str(m() if callable(m) else e))
            t1 = time.perf_counter()
            answers[i] += 1
            latencies[i] = t1 - t0
            done_times.append(t1)

        tasks = []
        start = time.perf_counter()
        res.start_unix = time.time()
        for i, off in enumerate(offsets):
            delay = start + off - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i)))
        res.sent = len(tasks)
        sent_span = (time.perf_counter() - start) if tasks else 0.0
        res.send_rate = res.sent / max(sent_span, 1e-9) if tasks else 0.0
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s + 5)
        for t in tasks:
            if not t.done():
                t.cancel()
        last = max(done_times) if done_times else start
        res.records = [(float(o), float(l) * 1e3, ok) for o, l, ok in zip(offsets, latencies, ok_flags)]
        if streamer is not None:
            summarize_stream(res, [s for s in streamed if s is not None and s.ok])
        res.lost, res.duplicated = sum(a == 0 for a in answers), sum(a > 1 for a in answers)
        summarize(res, latencies, ok_flags, errors, start, last)
        if classes:
            span = max(last - start, res.duration_s, 1e-9)
            res.classes, res.sla_violation_rate = class_summary(latencies, ok_flags, which, classes, span)
        return res
    finally:
        await client.close()
        if streamer is not None:
            await streamer.close()


def stream_figures(ttft_ms: Sequence[float], tpot_ms: Sequence[float]) -> dict[str, float]:
    """TTFT avg/p50/p99 and TPOT avg/p99 (numpy's interpolated percentiles), the keys of what is there; one
    definition for both load drivers (perf_analyzer's come from its export: lazybatch/perf.py)."""
    out: dict[str, float] = {}
    ttft, tpot = np.asarray(ttft_ms, dtype=float), np.asarray(tpot_ms, dtype=float)
    if ttft.size:
        out["ttft_avg_ms"] = float(ttft.mean())
        out["ttft_p50_ms"], out["ttft_p99_ms"] = (float(v) for v in np.percentile(ttft, [50, 99]))
    if tpot.size:
        out["tpot_avg_ms"] = float(tpot.mean())
        out["tpot_p99_ms"] = float(np.percentile(tpot, 99))
    return out


def summarize_stream(res: LoadResult, answers: Sequence[Any]) -> LoadResult:
    """Time to first token and time per output token (after the first) over the successful streamed answers."""
    res.tokens = int(sum(a.n_tokens for a in answers))
    figures = stream_figures([a.ttft_s * 1e3 for a in answers],
                             [a.tpot_s * 1e3 for a in answers if not math.isnan(a.tpot_s)])
    for k, v in figures.items():
        setattr(res, k, v)
    return res


def run_load(url: str, model: str, rate: float, duration_s: float = 10.0, *, sla_ms: float | None = 100.0,
             batch: int = 1, seed: int = 0, max_requests: int = 100_000, timeout_s: float = 30.0,
             send_sla: bool = True, length_histogram: str | None = None, ignore_eos: bool = True,
             streaming: bool = False, classes: Sequence[Any] | None = None) -> LoadResult:
    """Poisson load at ``rate`` requests/s for ``duration_s`` seconds against one model.

    Seq2seq models (client/seq2seq.py) get per-request source and output lengths drawn from ``length_histogram``
    (default: the shipped WMT-like one) with ``seed``; ``ignore_eos`` makes each request decode exactly its drawn
    output length. ``streaming``: the model is decoupled; each request is a gRPC stream of its own, and the result
    adds time to first token and time per output token (client/stream.py). ``classes``: traffic classes
    (lazybatch.traffic.TrafficClass); each request is drawn into one, carries its SLA and priority, and the result
    has each class's own figures (``LoadResult.classes``)."""
    return asyncio.run(_run_one_rate(url, model, rate, duration_s, sla_ms=sla_ms, batch=batch, seed=seed,
                                     max_requests=max_requests, timeout_s=timeout_s, send_sla=send_sla,
                                     length_histogram=length_histogram, ignore_eos=ignore_eos,
                                     streaming=streaming, classes=classes))


def run_schedule(url: str, model: str, offsets: Sequence[float], *, sla_ms: float | None = 100.0, batch: int = 1,
                 seed: int = 0, max_requests: int = 1_000_000, timeout_s: float = 30.0,
                 send_sla: bool = True) -> LoadResult:
    """Open-loop load that sends one request at each of ``offsets`` (seconds from the start), e.g. from
    ``schedule_from_rates``; ``offered_rate`` is reported as the schedule's mean rate."""
    span = max(offsets) if offsets else 0.0
    rate = len(offsets) / span if span > 0 else 0.0
    return asyncio.run(_run_one_rate(url, model, rate, span, sla_ms=sla_ms, batch=batch, seed=seed,
                                     max_requests=max_requests, timeout_s=timeout_s, send_sla=send_sla,
                                     offsets=offsets))


def sweep(url: str, models: Sequence[str], rates: Sequence[float], duration_s: float = 10.0, *,
          sla_ms: float | None | Mapping[str, float | None] = 100.0, batch: int = 1, seed: int = 0,
          timeout_s: float = 30.0, pause_s: float = 0.5, progress: Any = None, length_histogram: str | None = None,
          ignore_eos: bool = True, streaming: bool = False, classes: Sequence[Any] | None = None) -> list[LoadResult]:
    """Every model at every rate, one after the other (models never share the CPU during a measurement).
    ``sla_ms``: one SLA for all, or one per model (a mapping)."""
    out = []
    for rate in rates:
        for model in models:
            sla = sla_ms.get(model) if isinstance(sla_ms, Mapping) else sla_ms
            r = run_load(url, model, rate, duration_s, sla_ms=sla, batch=batch, seed=seed, timeout_s=timeout_s,
                         length_histogram=length_histogram, ignore_eos=ignore_eos, streaming=streaming,
                         classes=classes)
            out.append(r)
            if progress is not None:
                progress(r)
            time.sleep(pause_s)
    return out


AGGREGATE = "(all)"  # the model column of the aggregate row of models driven together (client/together.py)
