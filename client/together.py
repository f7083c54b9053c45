"""Several models driven at once: co-located load (docs/colocation.md), for ``lazybatch load --together`` and
``lazybatch perf --together``.

One aggregate request rate is split across the models by a mix (``m1=0.7,m2=0.3``; equal shares by default), and
every model gets its own open-loop Poisson stream at its share, its own seed and its own SLA; all streams start
together. The per-model sender is ``load._run_one_rate``, unchanged: here it is only started once per model on one
event loop. The aggregate row pools the models: counts add up, its latency percentiles are over every request of
every model, its SLA violations count each request against its own model's SLA, and its throughput is the sum of
the models' throughputs.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

from .load import AGGREGATE, LoadResult, _run_one_rate, run_load


def _pairs(text: str, what: str) -> dict[str, str]:
    """``a=1,b=2`` as ``{"a": "1", "b": "2"}``; a ConfigError naming ``what`` where a part has no name."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise ConfigError(f"expected MODEL=VALUE pairs separated by commas, got {part!r}", field=what)
        if name.strip() in out:
            raise ConfigError(f"{name.strip()!r} given twice", field=what)
        out[name.strip()] = value.strip()
    return out


def _check_names(given: Sequence[str], models: Sequence[str], what: str) -> None:
    unknown = [m for m in given if m not in models]
    if unknown:
        raise ConfigError(f"it names {', '.join(unknown)}, not among the models driven ({', '.join(models)})",
                          field=what)
    missing = [m for m in models if m not in given]
    if missing:
        raise ConfigError(f"it must give every model driven; missing: {', '.join(missing)}", field=what)


def parse_mix(text: str | None, models: Sequence[str]) -> dict[str, float]:
    """Each model's share of the aggregate rate: ``None`` gives equal shares; ``m1=0.7,m2=0.3`` names every model
    with a share in (0, 1], and the shares add up to 1."""
    if not models:
        raise ConfigError("name at least one model")
    if text is None or not str(text).strip():
        return {m: 1.0 / len(models) for m in models}
    pairs = _pairs(text, "--mix")
    _check_names(list(pairs), models, "--mix")
    shares: dict[str, float] = {}
    for m in models:
        try:
            shares[m] = float(pairs[m])
        except ValueError:
            raise ConfigError(f"the share of {m} is {pairs[m]!r}, not a number (a fraction of the "
                              f"requests, e.g. {m}=0.7)", field="--mix") from None
        if not (0.0 < shares[m] <= 1.0):
            raise ConfigError(f"the share of {m} must be in (0, 1], got {pairs[m]}", field="--mix")
    total = sum(shares.values())
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"the shares must add up to 1, got {total:g} "
                          f"({' + '.join(f'{v:g}' for v in shares.values())})", field="--mix")
    return shares


def parse_sla(text: str | float | None, models: Sequence[str]) -> dict[str, float | None]:
    """Each model's SLA in ms: one number for every model (``100``), or ``m1=20,m2=200`` naming each model;
    ``None`` or ``none``: no SLA."""
    if text is None or str(text).strip().lower() == "none":
        return {m: None for m in models}

    def ms(value: str, who: str) -> float:
        try:
            v = float(value)
        except ValueError:
            raise ConfigError(f"{value!r}{who} is not a number of ms (give 100, or MODEL=MS pairs "
                              f"like m1=20,m2=200)", field="--sla-ms") from None
        if not (v > 0.0 and math.isfinite(v)):
            raise ConfigError(f"the SLA{who} must be a positive number of ms, got {value}", field="--sla-ms")
        return v

    if "=" not in str(text):
        v = ms(str(text).strip(), "")
        return {m: v for m in models}
    pairs = _pairs(str(text), "--sla-ms")
    _check_names(list(pairs), models, "--sla-ms")
    return {m: ms(pairs[m], f" of {m}") for m in models}


def split_rate(rate: float, shares: Mapping[str, float]) -> dict[str, float]:
    """Each model's own rate: its share of the aggregate ``rate``."""
    if not rate > 0:
        raise ConfigError(f"the aggregate rate must be positive, got {rate:g}")
    return {m: rate * s for m, s in shares.items()}


def model_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th model's stream: independent of the others', the same on every run of ``seed``
    (and the same for the model alone and beside the others, so those two runs send the same arrivals)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def aggregate(results: Sequence[LoadResult], rate: float | None = None) -> LoadResult:
    """The aggregate row of models driven together: counts summed; avg/p50/p90/p99/max over every answered request
    of every model; SLA violations (late against the request's own model's SLA, plus failed) over all sent;
    throughput the sum of the models' throughputs; ``rate`` (default the sum of the models' rates) offered."""
    rs = list(results)
    if not rs:
        raise ValueError("no results to aggregate")
    agg = LoadResult(AGGREGATE, float(rate if rate is not None else sum(r.offered_rate for r in rs)),
                     max(r.duration_s for r in rs), None, rs[0].batch)
    for key in ("sent", "ok", "errors", "lost", "duplicated"):
        setattr(agg, key, sum(getattr(r, key) for r in rs))
    agg.send_rate = sum(r.send_rate for r in rs)
    agg.throughput = sum(r.throughput for r in rs)
    agg.start_unix = min(r.start_unix for r in rs)
    for r in rs:
        for k, n in r.error_kinds.items():
            agg.error_kinds[k] = agg.error_kinds.get(k, 0) + n
    lat = np.array([v for r in rs for v in r.latencies_ms], dtype=float)
    if lat.size:
        agg.latencies_ms = [float(v) for v in lat]
        agg.avg_ms = float(lat.mean())
        agg.p50_ms, agg.p90_ms, agg.p99_ms = (float(v) for v in np.percentile(lat, [50, 90, 99]))
        agg.max_ms = float(lat.max())
    if agg.sent:
        late = sum(int((np.asarray(r.latencies_ms) > r.sla_ms).sum()) for r in rs if r.sla_ms is not None)
        agg.sla_violation_rate = (late + agg.sent - agg.ok) / agg.sent
    return agg


class StartGate:
    """Opens once ``n`` waiters have arrived: the models' schedules start together, each after its warm-up (the
    standard library's asyncio.Barrier is Python 3.11's)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.event = asyncio.Event()

    async def wait(self) -> None:
        self.n -= 1
        if self.n <= 0:
            self.event.set()
        await self.event.wait()


async def _together(url: str, rates: Mapping[str, float], duration_s: float, slas: Mapping[str, float | None],
                    seed: int, **kw: Any) -> list[LoadResult]:
    gate = StartGate(len(rates))
    runs = [_run_one_rate(url, m, r, duration_s, sla_ms=slas.get(m), seed=model_seed(seed, k), start_gate=gate,
                          **kw) for k, (m, r) in enumerate(rates.items())]
    return list(await asyncio.gather(*runs))


def run_at_rates(url: str, rates: Mapping[str, float], duration_s: float, *, sla_ms: Mapping[str, float | None],
                 seed: int = 0, batch: int = 1, max_requests: int = 100_000, timeout_s: float = 30.0,
                 send_sla: bool = True, length_histogram: str | None = None, ignore_eos: bool = True,
                 streaming: bool = False) -> list[LoadResult]:
    """Every model of ``rates`` at once at its own rate (requests/s), started together: the models' results in the
    order of ``rates``, no aggregate row (``lazybatch load --capacity --beside``)."""
    return asyncio.run(_together(url, rates, duration_s, sla_ms, seed, batch=batch, max_requests=max_requests,
                                 timeout_s=timeout_s, send_sla=send_sla, length_histogram=length_histogram,
                                 ignore_eos=ignore_eos, streaming=streaming))


def run_together(url: str, shares: Mapping[str, float], rate: float, duration_s: float = 10.0, *,
                 sla_ms: Mapping[str, float | None], batch: int = 1, seed: int = 0, max_requests: int = 100_000,
                 timeout_s: float = 30.0, send_sla: bool = True, length_histogram: str | None = None,
                 ignore_eos: bool = True, streaming: bool = False) -> list[LoadResult]:
    """Every model of ``shares`` at once at its share of the aggregate ``rate``: one open-loop Poisson stream per
    model (seeded with ``model_seed``), started together after each model's warm-up, each with its own SLA. Returns
    the models' results in the order of ``shares`` and the aggregate row last."""
    rates = split_rate(rate, shares)
    results = asyncio.run(_together(url, rates, duration_s, sla_ms, seed, batch=batch, max_requests=max_requests,
                                    timeout_s=timeout_s, send_sla=send_sla, length_histogram=length_histogram,
                                    ignore_eos=ignore_eos, streaming=streaming))
    return results + [aggregate(results, rate)]


def sweep_together(url: str, shares: Mapping[str, float], rates: Sequence[float], duration_s: float = 10.0, *,
                   sla_ms: Mapping[str, float | None], seed: int = 0, alone: bool = False, pause_s: float = 0.5,
                   progress: Callable[[LoadResult, str], None] | None = None, **kw: Any) -> list[LoadResult]:
    """``run_together`` at each aggregate rate. ``alone``: first each model by itself at its own share of the rate,
    with the same arrivals it gets beside the others; its p99 then is ``p99_alone_ms`` of its row together."""
    out: list[LoadResult] = []
    for rate in rates:
        p99_alone: dict[str, float] = {}
        if alone:
            for k, (m, r) in enumerate(split_rate(rate, shares).items()):
                one = run_load(url, m, r, duration_s, sla_ms=sla_ms.get(m), seed=model_seed(seed, k), **kw)
                p99_alone[m] = one.p99_ms
                if progress is not None:
                    progress(one, "alone")
                time.sleep(pause_s)
        rows = run_together(url, shares, rate, duration_s, sla_ms=sla_ms, seed=seed, **kw)
        for r in rows:
            r.p99_alone_ms = p99_alone.get(r.model, math.nan)
            if progress is not None:
                progress(r, "together")
        out += rows
        time.sleep(pause_s)
    return out

