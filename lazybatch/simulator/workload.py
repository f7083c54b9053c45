"""Open-loop request streams: seeded Poisson arrivals or a trace file."""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.request import Request


@dataclass(frozen=True, slots=True)
class Arrival:
    time: float
    enc_steps: int = 1
    dec_steps: int = 1
    sla: float | None = None  # seconds; None = the run's SLA target


def poisson(rate: float, n: int, seed: int, *, graph: ModelGraph | None = None,
            lengths: LengthHistogram | None = None) -> list[Arrival]:
    """``n`` arrivals at ``rate`` requests/s; seq2seq models draw input and output lengths from ``lengths``."""
    if not (rate > 0) or not math.isfinite(rate):
        raise ConfigError(f"arrival rate must be a positive number of requests/s, got {rate!r}", field="rate")
    if n < 1:
        raise ConfigError(f"the number of requests must be at least 1, got {n}", field="requests")
    rng = random.Random(seed)
    t = 0.0
    times = []
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    if graph is not None and graph.is_seq2seq:
        if lengths is None:
            raise ConfigError(f"{graph.name} has encoder/decoder stages: a length histogram is needed",
                              field="length_histogram")
        enc = lengths.sample(rng, n)
        dec = lengths.sample(rng, n)
        return [Arrival(a, e, d) for a, e, d in zip(times, enc, dec)]
    return [Arrival(a) for a in times]


def load_trace(path: str | Path) -> list[Arrival]:
    """CSV with a header: ``arrival_s`` (required), ``enc_steps``, ``dec_steps``, ``sla_ms`` (optional)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read trace: {e.strerror}", source=str(p)) from None
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None or "arrival_s" not in reader.fieldnames:
        raise ConfigError("a trace is CSV with a header naming at least 'arrival_s' (and optionally enc_steps, "
                          "dec_steps, sla_ms)", field="arrival_s", source=str(p))
    out: list[Arrival] = []
    for line, row in enumerate(reader, start=2):
        try:
            t = float(row["arrival_s"])
            enc = int(row.get("enc_steps") or 1)
            dec = int(row.get("dec_steps") or 1)
            sla = float(row["sla_ms"]) / 1e3 if row.get("sla_ms") else None
        except ValueError as e:
            raise ConfigError(f"line {line}: {e}", field="arrival_s/enc_steps/dec_steps/sla_ms",
                              source=str(p)) from None
        if not math.isfinite(t) or t < 0:
            raise ConfigError(f"line {line}: arrival_s must be a non-negative number, got {t}", field="arrival_s",
                              source=str(p))
        if enc < 1 or dec < 1:
            raise ConfigError(f"line {line}: enc_steps and dec_steps must be >= 1", field="enc_steps/dec_steps",
                              source=str(p))
        if sla is not None and sla <= 0:
            raise ConfigError(f"line {line}: sla_ms must be positive", field="sla_ms", source=str(p))
        out.append(Arrival(t, enc, dec, sla))
    if not out:
        raise ConfigError("the trace holds no requests", source=str(p))
    out.sort(key=lambda a: a.time)
    return out


def save_trace(arrivals: list[Arrival], path: str | Path) -> Path:
    p = Path(path)
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "enc_steps", "dec_steps", "sla_ms"])
        for a in arrivals:
            w.writerow([repr(a.time), a.enc_steps, a.dec_steps, "" if a.sla is None else a.sla * 1e3])
    return p


def requests(arrivals: list[Arrival], sla: float) -> list[Request]:
    return [Request(i, a.time, sla=a.sla if a.sla is not None else sla, enc_steps=a.enc_steps,
                    dec_steps=a.dec_steps) for i, a in enumerate(arrivals)]


def rate_trace(duration: float = 300.0, low: float = 1.0, high: float = 240.0, seed: int = 0,
               step: float = 1.0) -> list[tuple[float, float]]:
    """A request-rate trace that wanders between ``low`` and ``high`` requests/s (seed 002's Fig. 2a shape).

    Piecewise constant per ``step`` seconds: a random walk in sqrt(rate) with momentum, reflected at the bounds,
    so it sweeps the whole range several times in 300 s with bursts and quiet spells. Returns (start, rate).
    """
    if not (0 < low < high):
        raise ConfigError(f"need 0 < low < high, got {low} and {high}", field="rate")
    if duration <= 0 or step <= 0:
        raise ConfigError("duration and step must be positive", field="duration")
    rng = random.Random(seed)
    lo, hi = math.sqrt(low), math.sqrt(high)  # a walk in sqrt(rate): quiet spells and bursts both last
    x, v = lo, 0.0
    out = []
    for i in range(int(math.ceil(duration / step))):
        v = 0.9 * v + rng.gauss(0.0, 0.35)
        x += v
        if x < lo:
            x, v = 2 * lo - x, abs(v)
        if x > hi:
            x, v = 2 * hi - x, -abs(v)
        x = min(max(x, lo), hi)
        out.append((i * step, x * x))
    return out


def arrivals_from_rates(trace: list[tuple[float, float]], seed: int = 0, duration: float | None = None,
                        graph: ModelGraph | None = None, lengths: LengthHistogram | None = None) -> list[Arrival]:
    """Poisson arrivals whose rate follows a piecewise-constant trace (time-varying, memoryless within a step)."""
    rng = random.Random(seed)
    end = duration if duration is not None else (trace[-1][0] + (trace[-1][0] - trace[-2][0] if len(trace) > 1
                                                                   else 1.0))
    times = []
    for i, (t0, rate) in enumerate(trace):
        t1 = trace[i + 1][0] if i + 1 < len(trace) else end
        t = t0
        while True:
            t += rng.expovariate(rate)
            if t >= t1:
                break
            times.append(t)
    if graph is not None and graph.is_seq2seq and lengths is not None:
        enc = lengths.sample(rng, len(times))
        dec = lengths.sample(rng, len(times))
        return [Arrival(a, e, d) for a, e, d in zip(times, enc, dec)]
    return [Arrival(a) for a in times]
