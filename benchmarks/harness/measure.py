"""What the served benchmarks measure on a running server: batch-1 times (the t1 loads and SLAs are multiples of),
seq2seq requests drawn as `lazybatch load` draws them, `lazybatch load` segments pooled into one cell (sustained or
not), and a perf_analyzer cell."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.method import CLIENT_PACE
from benchmarks.harness.stats import percentile, violation
from lazybatch.client.capacity import ANSWERED, DRIFT, steady


def seq2seq_requests(http: str, model: str, n: int, seed: int = 0) -> list[dict] | None:
    """``n`` batch-1 requests of a served seq2seq model, their lengths drawn from the histogram the model is served
    with, as `lazybatch load` draws them (client/seq2seq.py); None for a model that is not seq2seq."""
    import urllib.request

    import numpy as np

    from lazybatch.client.seq2seq import LengthSampler, http_parameters, info_from_parameters, make_request

    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/config", timeout=10) as f:
        info = info_from_parameters(http_parameters(json.loads(f.read())))
    if info is None:
        return None
    sampler, rng = LengthSampler(info, None, seed), np.random.default_rng(seed)
    return [make_request(rng, info, *sampler.draw()) for _ in range(n)]


def service_time(client: Any, model: str, n: int, *, warmup: int = 3) -> float:
    """Median latency (s) of ``n`` sequential batch-1 requests of random inputs (at the model's example_dims) after
    ``warmup`` untimed ones: the model's batch-1 service time as the server delivers it (t1). The request's SLA is
    a minute, far past any deadline a lone request could miss."""
    return client.median_latency(model, client.random_inputs(model, 1, seed=0), n, warmup=warmup, sla_ms=60_000)


def static_t1(url: str, kind: str) -> float:
    """``service_time`` of the repository's Triton 0 ms model of a static ``kind`` (``<kind>_triton_0us``): the
    served t1 that the sweeps' loads and SLAs are multiples of."""
    from lazybatch.client.api import Client

    model = f"{kind}_triton_0us"
    with Client(url) as c:
        return service_time(c, model, 200 if kind == "mlp" else 30)


def seq2seq_t1(url: str, http: str, model: str, n: int) -> float:
    """Mean latency (s) of ``n`` requests of a served seq2seq model, of its histogram's lengths, sent one at a time:
    1 / the batch-1 service rate."""
    from lazybatch.client.api import Client

    feeds = seq2seq_requests(http, model, n + 2, seed=1)
    with Client(url) as c:
        times = c.latencies(model, feeds, n + 2, warmup=0)[2:]
    return statistics.fmean(times)


def load_segment(r: Any, duration: float) -> dict:
    """One segment of `lazybatch load` (a client.load.LoadResult of ``duration`` s) as ``pool_load`` pools it: its
    answers' latencies and records (send offset, latency, answered)."""
    return {"sent": r.sent, "ok": r.ok, "errors": r.errors, "latencies": r.latencies_ms, "records": r.records,
            "send_rate": r.send_rate, "duration": duration}


def pool_load(segs: list[dict], sla_ms: float) -> dict:
    """A cell's figures from its segments under `lazybatch load`: every answer pooled (average, p99, violations);
    the pace is the sent-weighted mean of the segments'; sustained where the segments' second halves, pooled, have
    a median at most DRIFT x their first halves' (a queue growing through each segment shows in every one) and
    answers reach ANSWERED of sends."""
    lat = np.concatenate([np.asarray(g["latencies"], dtype=float) for g in segs]) if segs else np.zeros(0)
    sent = sum(g["sent"] for g in segs)
    ok = sum(g["ok"] for g in segs)
    errors = sum(g["errors"] for g in segs)
    paces = [(steady(g["records"], g["send_rate"], g["duration"]).sent, g["sent"]) for g in segs if g["sent"]]
    pace = sum(p * n for p, n in paces) / max(sum(n for _, n in paces), 1)
    first = [lat_ms for g in segs for t, lat_ms, good in g["records"] if good and t < g["duration"] / 2]
    second = [lat_ms for g in segs for t, lat_ms, good in g["records"] if good and t >= g["duration"] / 2]
    drift = float(np.median(second) / np.median(first)) if first and second else math.nan
    return {"sent": sent, "ok": ok, "errors": errors, "avg_ms": float(lat.mean()) if lat.size else math.nan,
            "p99_ms": percentile(lat, 99),
            "throughput": ok / sum(g["duration"] for g in segs) if segs else math.nan,
            "violations": violation(lat, errors, sent, sla_ms), "requests": ok, "pace": pace,
            "client_bound": pace < CLIENT_PACE, "drift": drift,
            "sustained": bool(drift <= DRIFT and sent and ok / sent >= ANSWERED)}


class PerfMeasuredNothing(RuntimeError):
    """perf_analyzer ran but no request ended inside its measurement windows (it exits 3): the configuration's
    latency is longer than a window there. A sweep records the cell as measured nothing and goes on; every other
    perf_analyzer failure still stops it."""


NOTHING_IN_WINDOW = "No valid requests recorded within time interval"


def perf_row(url: str, model: str, rate: float, duration: float, seed: int, out: Path,
             sla_ms: float | None = None, seeded_arrivals: bool = False) -> dict:
    """One served cell offered by NVIDIA perf_analyzer (`lazybatch perf`: Poisson at ``rate``, --async, valid
    seq2seq input data drawn with ``seed``, --streaming for a decoupled model): its perf.json row. Windows of a
    third of ``duration``, three of them where they pass perf_analyzer's stability check, whose threshold is set out
    of reach (the repetitions are the benchmark's own; on a loaded 2-core machine, or with whole decodes seconds
    long, its check fails windows that differ only by chance); at most 10. perf_analyzer stops at the first failed
    request, so a row means none failed. ``seeded_arrivals``: Poisson arrivals drawn with ``seed`` (`lazybatch perf
    --poisson-seed`) instead of perf_analyzer's own schedule, which is the same sequence on every run."""
    from lazybatch.cli import main as lazybatch_cli

    folder = Path(out) / "perf" / f"{model}_{rate:.3f}_{seed}"
    cmd = ["perf", model, "--url", url, "--rates", f"{rate:.4f}", "--measurement-ms", str(int(duration * 1000 / 3)),
           "--stability-percentage", "10000", "--max-trials", "10", "--seed", str(seed), "--out", str(folder)]
    if sla_ms is not None:
        cmd += ["--sla-ms", f"{sla_ms:g}"]
    if seeded_arrivals:
        cmd += ["--poisson-seed", str(seed)]
    if lazybatch_cli(cmd) != 0:
        log = folder / f"perf_{model}.log"
        if log.exists() and NOTHING_IN_WINDOW in log.read_text(errors="replace"):
            raise PerfMeasuredNothing(f"no request ended inside perf_analyzer's {int(duration * 1000 / 3)} ms "
                                      f"windows ({log})")
        raise SystemExit(f"perf_analyzer failed on {model}: see {folder}")
    return json.loads((folder / "perf.json").read_text())[0]


def served_table(model_dir: Path) -> tuple[Any, Any]:
    """The latency table a served seq2seq model's policy reads, and the shipped length histogram its clients draw
    from (LatencyTable, LengthHistogram)."""
    from lazybatch.batcher.latency_table import LatencyTable
    from lazybatch.batcher.lengths import LengthHistogram
    from lazybatch.formats.histograms import shipped_histogram

    manifest = json.loads((model_dir / "stages" / "manifest.json").read_text())
    hist = LengthHistogram.load(shipped_histogram(manifest["seq2seq"].get("length_histogram")))
    return LatencyTable.load(model_dir / "latency.json"), hist
