"""What the benchmarks share: the machine and commit a figure comes from, repetitions summarised with their spread,
and raw data written beside the figures (docs/data/). Each benchmark stays a short script that reads like its
experiment; the plumbing lives here."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]


def machine_meta() -> dict:
    """The machine, the versions and the commit a run measured (a dirty tree says so)."""
    import numpy
    import onnxruntime

    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def ver(dist: str) -> str:
        try:
            from importlib.metadata import version

            return version(dist)
        except Exception:
            return "?"
    full = git_commit()
    commit = "?" if full is None else full[:7] + (" + uncommitted changes" if full.endswith("+dirty") else "")
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__, "pytriton": ver("nvidia-pytriton"),
            "tritonclient": ver("tritonclient"), "commit": commit,
            "loadavg_before": " ".join(f"{v:.1f}" for v in os.getloadavg())}


def git_commit() -> str | None:
    """The checkout's HEAD commit, with "+dirty" when tracked files differ from it (recorded with the figures)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def spread(values: Sequence[float]) -> dict[str, float]:
    """Repetitions of one figure: mean, min, max and their count (the docs quote mean [min-max])."""
    v = [float(x) for x in values]
    return {"mean": statistics.fmean(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt(s: dict[str, float], digits: int = 2, unit: str = "") -> str:
    """``1.23x [1.10-1.31]`` style: the mean and the range over repetitions."""
    return f"{s['mean']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def verdict(s: dict[str, float], at_least: float) -> str:
    """met / tie / missed for a ratio goal: a range that straddles the goal is a tie, not a win."""
    if s["min"] >= at_least:
        return "met"
    if s["max"] >= at_least:
        return "tie (the spread straddles the goal)"
    return "missed"


def held_out_ratios(baselines: dict[str, Sequence[float]], ours: Sequence[float]) -> tuple[list[float], list[str]]:
    """The best baseline's figure / ours, repetition by repetition (e.g. average latencies, lower is better), where
    repetition k's best is the baseline with the lowest mean over the other repetitions. Chosen on repetition k
    itself, the lowest of several noisy figures is biased low, against ours: a policy identical to one baseline
    would often come out behind. Also returns the baseline chosen for each repetition."""
    n = min([len(v) for v in baselines.values()] + [len(ours)]) if baselines else 0
    ratios, picks = [], []
    for k in range(n):
        def others(name: str) -> float:
            vals = baselines[name][:n]
            rest = [a for j, a in enumerate(vals) if j != k and a > 0 and math.isfinite(a)] or list(vals)
            return statistics.fmean(rest)

        best = min(baselines, key=others)
        t, o = baselines[best][k], ours[k]
        if o > 0 and t > 0 and math.isfinite(t / o):
            ratios.append(t / o)
            picks.append(best)
    return ratios, picks


def geomean(values: Sequence[float]) -> float:
    """The mean of ratios: 2x and 0.5x average to 1x (an arithmetic mean would call that 1.25x)."""
    return math.exp(statistics.fmean(math.log(v) for v in values))


def write_json(path: str | Path, data: Any) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1) + "\n")
    return p


def add_sweep_args(ap: Any, *, loads: str, reps: int, duration: float, out: str, data: str) -> None:
    """The options every served sweep takes: --loads (fractions of the batch-1 rate), --reps, --duration, --out,
    --data (a copy of the raw results, e.g. for docs/data/); parse with ``parse_sweep_args``."""
    ap.add_argument("--loads", default=loads, help=f"fractions of the batch-1 rate ({loads})")
    ap.add_argument("--reps", type=int, default=reps, help=f"repetitions per cell ({reps})")
    ap.add_argument("--duration", type=float, default=duration, help=f"seconds of arrivals per cell ({duration:g})")
    ap.add_argument("--out", default=out, help="results folder")
    ap.add_argument("--data", default=None,
                    help=f"also copy the raw results here (none unless given; the docs' copy is {data})")


def add_perf_arrivals_arg(ap: Any, driver: str) -> None:
    """--perf-arrivals, the same for every benchmark with a perf_analyzer driver (``driver``: its name there)."""
    ap.add_argument("--perf-arrivals", choices=("perf_analyzer", "seeded"), default="perf_analyzer",
                    help=f"{driver}: perf_analyzer's own Poisson schedule (its default; the same sequence on every "
                         "run, so the repetitions are the same arrivals) or arrivals drawn with each repetition's seed "
                         "(`lazybatch perf --poisson-seed`, perf_analyzer's --request-intervals)")


def parse_sweep_args(ap: Any, argv: list[str] | None) -> Any:
    args = ap.parse_args(argv)
    args.loads = [float(x) for x in args.loads.split(",")]
    return args


def turns(loads: Sequence[float], reps: int, policies: Sequence[str], desc: str) -> Iterator[tuple[float, int, str]]:
    """(load, repetition, policy) in the order the served sweeps measure them, with a progress bar: at each load every
    repetition runs every policy once, taking turns, the order reversed every other repetition (no policy always
    runs first after a load change)."""
    from tqdm import tqdm

    for f, k in tqdm([(f, k) for f in loads for k in range(reps)], desc=desc, unit="rep"):
        for pol in (list(policies) if k % 2 == 0 else list(reversed(policies))):
            yield f, k, pol


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


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


def static_t1(url: str, kind: str) -> float:
    """Median latency (s) of sequential batch-1 requests to the repository's Triton 0 ms model of a static ``kind``
    (``<kind>_triton_0us``): the served t1 that the sweeps' loads and SLAs are multiples of."""
    from lazybatch.client.api import Client

    model = f"{kind}_triton_0us"
    with Client(url) as c:
        return c.median_latency(model, c.random_inputs(model, 1, seed=0), 200 if kind == "mlp" else 30,
                                sla_ms=60_000)


def seq2seq_t1(url: str, http: str, model: str, n: int) -> float:
    """Mean latency (s) of ``n`` requests of a served seq2seq model, of its histogram's lengths, sent one at a time:
    1 / the batch-1 service rate."""
    from lazybatch.client.api import Client

    feeds = seq2seq_requests(http, model, n + 2, seed=1)
    with Client(url) as c:
        times = c.latencies(model, feeds, n + 2, warmup=0)[2:]
    return statistics.fmean(times)


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
