"""NVIDIA perf_analyzer for lazybatch models: install it into the virtualenv, run it, read its CSV report.

Why this route (docs/triton.md): the newest perf_analyzer package does not install here, but the
``tritonclient==2.41.0`` wheel carries a working ``perf_analyzer`` binary (``.data/data/bin/``). It needs
``libb64.so.0d`` and ``libcudart.so.12``, which ship under hashed names in ``nvidia_pytriton.libs/`` (the serve
extra); symlinks with the plain names suffice. The wheel is only unpacked; the venv's own tritonclient stays.
perf_analyzer 2.41 sends synchronous requests in request-rate mode unless given ``--async``, so it always is.

Its Poisson schedule is drawn from the same seed on every run (it has no seed option): every run, at every rate,
sends one fixed sequence of exponential gaps scaled by 1/rate (the retired probe `git show 555b6b3:benchmarks/probes/probe_perf_rate.py` showed two runs' gaps
equal). Repetitions with it are the same arrivals, and over a few seconds that sequence's long early gaps offer
0.6-0.9 of the asked rate. ``poisson_seed`` draws the gaps here instead and hands them to perf_analyzer's own
``--request-intervals``: a different sequence per seed, at the asked rate on average.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from lazybatch.batcher.errors import ConfigError

# installing it is perf_install.py's; callers reach it through this module (perf.install, perf.find_perf_analyzer)
from .perf_install import find_perf_analyzer, install, venv_dir, wrapper_path  # noqa: F401


@dataclass
class PerfRow:
    """One perf_analyzer measurement (one request rate)."""

    model: str
    request_rate: float
    throughput: float  # inferences/s
    avg_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    client_send_recv_ms: float
    server_queue_ms: float
    server_compute_ms: float
    # streaming (perf_analyzer --streaming on a decoupled model), from its --profile-export-file timestamps:
    # request sent to first response, and the mean gap between the following responses (with one token a response,
    # stream_interval_tokens 1, the time per output token); NaN where perf_analyzer did not stream
    ttft_avg_ms: float = math.nan
    ttft_p50_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    tpot_avg_ms: float = math.nan
    tpot_p99_ms: float = math.nan
    streamed_requests: int = 0
    unanswered_requests: int = 0  # in its export with no response at all
    # where its export was kept (streamed, or `perf --together`): the requests in it, those answered more than once
    # (a model that does not stream answers each request once), and the latency of each answered one (ms)
    requests: int = 0
    duplicated_requests: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    def row(self) -> dict[str, Any]:
        """The row as perf.json keeps it (without the per-request latencies)."""
        d = asdict(self)
        d.pop("latencies_ms")
        return d


def poisson_intervals(rate: float, count: int, seed: int | Sequence[int]) -> list[int]:
    """``count`` exponential gaps (us, at least 1) of a Poisson process at ``rate``/s, drawn with ``seed``."""
    import numpy as np

    if rate <= 0:
        raise ConfigError(f"a Poisson rate must be positive, got {rate:g}")
    gaps = np.random.default_rng(seed).exponential(1e6 / rate, size=count)
    return [max(1, int(round(g))) for g in gaps]


def write_intervals(path: Path, rate: float, seed: int | Sequence[int], *, measurement_ms: int, max_trials: int) -> Path:
    """perf_analyzer's --request-intervals file: enough gaps for every window it may take (it loops around the
    file past its end, which would repeat arrivals), with a margin for its warm-up and the windows' overrun."""
    count = int(rate * (max_trials + 2) * measurement_ms / 1000 * 1.5) + 100
    Path(path).write_text("\n".join(map(str, poisson_intervals(rate, count, seed))) + "\n")
    return Path(path)


def command(perf: Path, model: str, url: str, rates: Sequence[float], *, batch: int = 1,
            measurement_ms: int = 4000, sla_ms: float | None = None, csv_path: Path | None = None,
            protocol: str = "grpc", stability_percentage: float = 50.0, max_trials: int = 6,
            extra: Sequence[str] = (), input_data: str | None = None,
            request_intervals: Path | None = None) -> list[str]:
    """perf_analyzer's command line; ``input_data`` None leaves perf_analyzer's default (random bytes, which hold
    NaN/Inf bit patterns in float inputs: served like any other value unless a model sets allow_nan: false).
    With ``request_intervals`` (a file of write_intervals) the arrivals are that file's, not perf_analyzer's own
    Poisson schedule; one rate then, the file's."""
    if request_intervals is not None:
        if len(rates) != 1:
            raise ConfigError("seeded arrivals (--request-intervals) are one rate per perf_analyzer run")
        rr = ""
    elif len(rates) == 1:
        rr = f"{rates[0]:g}"
    else:
        step = rates[1] - rates[0]
        if any(abs((b - a) - step) > 1e-9 for a, b in zip(rates, rates[1:])) or step <= 0:
            raise ConfigError("perf_analyzer sweeps evenly spaced rates (start:end:step); give rates like 5,10,15")
        rr = f"{rates[0]:g}:{rates[-1]:g}:{step:g}"
    arrivals = (["--request-intervals", str(request_intervals)] if request_intervals is not None
                else ["--request-distribution", "poisson", "--request-rate-range", rr])
    cmd = [str(perf), "-m", model, "-u", url, "-i", protocol, "-b", str(batch), "--async", *arrivals,
           "-p", str(measurement_ms), "--max-trials", str(max_trials),
           "--stability-percentage", f"{stability_percentage:g}"]
    if input_data is not None:
        cmd += ["--input-data", input_data]
    if sla_ms is not None:
        cmd += ["--request-parameter", f"sla_ms:{int(round(sla_ms))}:int"]
    if csv_path is not None:
        cmd += ["-f", str(csv_path)]
    return cmd + list(extra)


def parse_csv(path: Path, model: str, console: str = "") -> list[PerfRow]:
    """perf_analyzer's -f CSV (latencies in us); the average comes from its console output."""
    import re

    avgs = [float(v) / 1e3 for v in re.findall(r"^\s*Avg latency: (\d+) usec", console, flags=re.M)]
    rows = []
    with Path(path).open() as f:
        for r in csv.DictReader(f):
            def us(key: str) -> float:
                v = r.get(key)
                return float(v) / 1e3 if v not in (None, "") else float("nan")
            rate_key = "Request Rate" if "Request Rate" in r else "Concurrency"
            avg = avgs[len(rows)] if len(rows) < len(avgs) else float("nan")
            rows.append(PerfRow(model, float(r[rate_key]), float(r["Inferences/Second"]), avg,
                                us("p50 latency"), us("p90 latency"), us("p99 latency"),
                                us("Client Send") + us("Client Recv"), us("Server Queue"),
                                us("Server Compute Input") + us("Server Compute Infer") + us("Server Compute Output")))
    return rows


def stream_timing(export_path: Path) -> dict[float, dict[str, float]]:
    """Time to first token and time per output token from perf_analyzer's ``--profile-export-file``, per request
    rate (its experiments): every request's send time and the times of its responses, in ns. perf_analyzer 2.41's
    CSV has no first-response column, so this is where a streamed model's TTFT under perf_analyzer comes from.
    The figures are ``lazybatch load``'s (``stream_figures``), so the two drivers' figures compare."""
    from lazybatch.client.load import stream_figures

    data = json.loads(Path(export_path).read_text())
    out: dict[float, dict[str, float]] = {}
    for exp in data.get("experiments", []):
        ttft, tpot, unanswered = [], [], 0
        for req in exp.get("requests", []):
            times = req.get("response_timestamps") or []
            if not times:
                unanswered += 1
                continue
            ttft.append((times[0] - req["timestamp"]) / 1e6)
            if len(times) > 1:
                tpot.append((times[-1] - times[0]) / (len(times) - 1) / 1e6)
        if ttft:
            out[float(exp["experiment"]["value"])] = stream_figures(ttft, tpot) | {
                "streamed_requests": len(ttft), "unanswered_requests": unanswered}
    return out


def request_counts(export_path: Path, *, streamed: bool = False) -> dict[float, dict[str, Any]]:
    """Per request rate (experiment) of perf_analyzer's ``--profile-export-file``: the requests it sent, those with
    no response, those with more than one (not streamed: a duplicate answer), and each answered request's latency
    (sent to last response, ms): what `perf --together` counts and pools across models."""
    data = json.loads(Path(export_path).read_text())
    out: dict[float, dict[str, Any]] = {}
    for exp in data.get("experiments", []):
        reqs = exp.get("requests", [])
        answered = [r for r in reqs if r.get("response_timestamps")]
        out[float(exp["experiment"]["value"])] = {
            "requests": len(reqs), "unanswered_requests": len(reqs) - len(answered),
            "duplicated_requests": 0 if streamed else sum(len(r["response_timestamps"]) > 1 for r in answered),
            "latencies_ms": [(r["response_timestamps"][-1] - r["timestamp"]) / 1e6 for r in answered]}
    return out


def run(perf: Path, model: str, url: str, rates: Sequence[float], out_dir: Path, *,
        poisson_seed: int | None = None, measurement_ms: int = 4000, max_trials: int = 6,
        **kw: object) -> tuple[list[PerfRow], str]:
    """Run perf_analyzer; returns its rows and its console output. Raises when it reports a failure. With
    ``--streaming`` among the extra arguments the rows also carry the time to first token and per output token
    (``stream_timing``; the timestamps stay in ``perf_<model>_export.json``). With ``poisson_seed`` the arrivals
    are drawn here (write_intervals), one perf_analyzer run per rate, each rate its own sequence of that seed; the
    files of a rate are then ``perf_<model>_<rate>.*`` where there are several rates."""
    kw |= {"measurement_ms": measurement_ms, "max_trials": max_trials}  # command's, and the intervals' length
    if poisson_seed is None:
        return _run_once(perf, model, url, rates, out_dir, f"perf_{model}", **kw)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, texts = [], []
    for i, rate in enumerate(rates):
        stem = f"perf_{model}" if len(rates) == 1 else f"perf_{model}_{rate:g}"
        intervals = write_intervals(out_dir / f"{stem}_intervals.txt", rate, [poisson_seed, i],
                                    measurement_ms=measurement_ms, max_trials=max_trials)
        got, text = _run_once(perf, model, url, [rate], out_dir, stem, request_intervals=intervals, **kw)
        for row in got:
            row.request_rate = rate  # perf_analyzer prints the file's rate rounded down to an integer
        rows += got
        texts.append(text)
    return rows, "\n".join(texts)


def run_together(perf: Path, shares: Mapping[str, float], url: str, rates: Sequence[float], out_dir: Path, *,
                 poisson_seed: int | None = None, measurement_ms: int = 4000, max_trials: int = 6,
                 per_model: Mapping[str, Mapping[str, Any]] | None = None,
                 **kw: Any) -> tuple[list[PerfRow], str]:
    """One perf_analyzer per model, started at once and waited for together, at each aggregate rate of ``rates``
    split by ``shares`` (client/together.py): each process its model's share as its Poisson rate, or with
    ``poisson_seed`` its own seeded gaps (``write_intervals``, seed ``[poisson_seed, rate index, model index]``).
    ``per_model``: a model's own arguments of ``command`` (its ``sla_ms``, ``input_data``, ``extra``). Every
    process keeps its per-request export, so that each row counts its requests, and a row per rate, model
    ``AGGREGATE``, pools them (``aggregate_rows``). Files: ``perf_<model>.*``, or ``perf_<model>_<its rate>.*``
    where there are several aggregate rates."""
    from lazybatch.client.together import split_rate

    kw |= {"measurement_ms": measurement_ms, "max_trials": max_trials}
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[PerfRow] = []
    texts: list[str] = []
    for i, rate in enumerate(rates):
        started: list[tuple[float, _Started]] = []
        try:
            for k, (model, r) in enumerate(split_rate(rate, shares).items()):
                stem = f"perf_{model}" if len(rates) == 1 else f"perf_{model}_{r:g}"
                mine = kw | dict((per_model or {}).get(model, {}))
                if poisson_seed is not None:
                    mine["request_intervals"] = write_intervals(
                        out_dir / f"{stem}_intervals.txt", r, [poisson_seed, i, k], measurement_ms=measurement_ms,
                        max_trials=max_trials)
                started.append((r, _start(perf, model, url, [r], out_dir, stem, export_requests=True, **mine)))
            group: list[PerfRow] = []
            while started:
                r, run = started[0]
                got, text = _finish(run)
                started.pop(0)
                for row in got:
                    row.request_rate = r  # the asked rate (perf_analyzer prints a file's rounded down)
                group += got
                texts.append(text)
        finally:
            for _, run in started:  # one failed: stop the others, which would otherwise run on unwaited
                run.proc.kill()
                run.proc.wait()
                run.console.close()
        rows += group + [aggregate_rows(group, rate)]
    return rows, "\n".join(texts)


def aggregate_rows(rows: Sequence[PerfRow], rate: float) -> PerfRow:
    """The aggregate row of models measured together: throughput summed; the average latency and the server's
    queue/compute/client times weighted by each model's throughput; p50/p90/p99 over every answered request in the
    models' exports (NaN without them); requests, unanswered and duplicated summed."""
    import numpy as np

    from lazybatch.client.load import AGGREGATE

    thr = sum(r.throughput for r in rows)

    def weighted(key: str) -> float:
        return sum(r.throughput * getattr(r, key) for r in rows) / thr if thr > 0 else math.nan

    lat = np.array([v for r in rows for v in r.latencies_ms], dtype=float)
    p50, p90, p99 = (float(v) for v in np.percentile(lat, [50, 90, 99])) if lat.size else (math.nan,) * 3
    return PerfRow(AGGREGATE, float(rate), thr, weighted("avg_ms"), p50, p90, p99, weighted("client_send_recv_ms"),
                   weighted("server_queue_ms"), weighted("server_compute_ms"),
                   unanswered_requests=sum(r.unanswered_requests for r in rows),
                   requests=sum(r.requests for r in rows),
                   duplicated_requests=sum(r.duplicated_requests for r in rows), latencies_ms=[float(v) for v in lat])


def _run_once(perf: Path, model: str, url: str, rates: Sequence[float], out_dir: Path, stem: str,
              **kw: object) -> tuple[list[PerfRow], str]:
    return _finish(_start(perf, model, url, rates, out_dir, stem, **kw))


@dataclass
class _Started:
    """A perf_analyzer process under way (``_start``), read by ``_finish``."""

    proc: subprocess.Popen
    cmd: list[str]
    console: Any  # a temporary file: its stdout and stderr (a pipe would fill while another process is waited on)
    model: str
    out_dir: Path
    stem: str
    kw: dict[str, Any]


def _start(perf: Path, model: str, url: str, rates: Sequence[float], out_dir: Path, stem: str, *,
           export_requests: bool = False, **kw: Any) -> _Started:
    """Start perf_analyzer without waiting for it. ``export_requests``: keep its per-request timestamps
    (``--profile-export-file``) as a streamed run does, for requests counted and pooled across models."""
    out_dir.mkdir(parents=True, exist_ok=True)
    export = out_dir / f"{stem}_export.json"
    if "--streaming" in kw.get("extra", ()) or export_requests:
        kw["extra"] = [*kw.get("extra", ()), "--profile-export-file", str(export)]
    elif export.exists():
        export.unlink()  # an earlier streamed run's: not this one
    cmd = command(perf, model, url, rates, csv_path=out_dir / f"{stem}.csv", **kw)
    console = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    return _Started(proc, cmd, console, model, out_dir, stem, kw)


def _finish(run: _Started) -> tuple[list[PerfRow], str]:
    """Wait for a started perf_analyzer; its rows and console output, or a ConfigError where it failed."""
    model, kw = run.model, run.kw
    csv_path, export = run.out_dir / f"{run.stem}.csv", run.out_dir / f"{run.stem}_export.json"
    run.proc.wait()
    run.console.seek(0)
    text = run.console.read()
    run.console.close()
    (run.out_dir / f"{run.stem}.log").write_text(" ".join(run.cmd) + "\n\n" + text)
    if run.proc.returncode != 0 or not csv_path.exists():
        tail = "\n".join(text.strip().splitlines()[-15:])
        hint = ""
        if kw.get("input_data") is None and "out of data bounds" in text:  # e.g. BERT's Gather on token ids
            hint = ("\nperf_analyzer's default input data is random bytes, which are not valid indices (token ids) "
                    "for this model: pass --input-data zero, or a JSON file of valid inputs (perf_analyzer's format)")
        raise ConfigError(f"perf_analyzer failed on {model} (exit {run.proc.returncode}):\n{tail}{hint}")
    rows = parse_csv(csv_path, model, text)
    if export.exists():
        streamed = "--streaming" in kw.get("extra", ())
        timing = stream_timing(export) if streamed else {}
        counts = request_counts(export, streamed=streamed)
        for row in rows:  # the experiment at the row's rate (both written by perf_analyzer from one value)
            for found in (timing, counts):
                t = next((v for rate, v in found.items() if math.isclose(rate, row.request_rate, rel_tol=1e-6)), {})
                if not t and kw.get("request_intervals") is not None and len(found) == 1:
                    t = next(iter(found.values()))  # one run of a file's arrivals: its one experiment
                for k, v in t.items():
                    setattr(row, k, v)
    return rows, text
