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
