"""``lazybatch profile``: per-stage median latency at each batch size on an onnxruntime execution provider.

Each stage runs on inputs produced by the stages before it (the chain is run once per batch size and round on
random model inputs), so data-dependent kernels see realistic tensors. The whole graph is timed the same way in the
same run, which gives the splitting overhead (sum of stage latencies / whole-graph latency). Only the listed batch
sizes are measured; the LatencyTable interpolates linearly between them.

Robust to a busy machine: the timed runs of every (stage, batch size) cell are spread over interleaved rounds (each
round visits every cell once, so a burst of background load touches one round of many cells rather than every
repetition of one), the median over all of a cell's runs is kept, and the rows are fitted monotone
(``LatencyTable.monotone``: non-decreasing in batch size, non-increasing per sample).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable, monotone_row
from lazybatch.sessions.chain import StageChain, random_feeds
from lazybatch.sessions.threads import global_thread_pool

from .manifest import load_manifest

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def parse_batch_sizes(text: str) -> list[int]:
    """'1,2,4,8' or '1-8' (every size) or '1,2,4,...,64' (powers of two up to 64)."""
    t = text.replace(" ", "")
    try:
        if "..." in t:
            head, last = t.split("...")
            nums = [int(x) for x in head.strip(",").split(",") if x]
            end = int(last.strip(","))
            if len(nums) < 2 or nums[0] < 1:
                raise ValueError
            sizes = list(nums)
            ratio = nums[-1] / nums[-2]
            step = nums[-1] - nums[-2]
            geometric = ratio == int(ratio) and ratio > 1 and all(b == a * ratio for a, b in zip(nums, nums[1:]))
            while sizes[-1] < end:
                sizes.append(int(sizes[-1] * ratio) if geometric else sizes[-1] + step)
            sizes = [s for s in sizes if s <= end]
            if sizes[-1] != end:
                sizes.append(end)
        elif "-" in t and "," not in t:
            a, b = (int(x) for x in t.split("-"))
            sizes = list(range(a, b + 1))
        else:
            sizes = [int(x) for x in t.split(",") if x]
    except ValueError:
        raise ConfigError(f"--batch-sizes {text!r} is not a list of sizes; write e.g. 1,2,4,8 or 1,2,4,...,64 or "
                          "1-16 (every size)") from None
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes) or sizes != sorted(sizes):
        raise ConfigError(f"--batch-sizes {text!r}: sizes must be positive, increasing and distinct")
    if sizes[0] != 1:
        raise ConfigError(f"--batch-sizes {text!r} must start at 1: the slack predictor needs single-input latency")
    return sizes


def default_length_histogram(name: str | None = None) -> Path:
    """The shipped length histogram a seq2seq export names (``chat`` for the decoder LM), else the synthetic WMT
    en-de one (lazybatch/simulator/data/; docs say where each comes from). An unknown name is an error, not a
    table without ``dec_timesteps_90``."""
    from lazybatch.formats.histograms import shipped_histogram

    return shipped_histogram(name)


def call_times(fn: Callable[[], Any], warmup: int, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed ones (profiles and probes share it)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _stage_times(chain: StageChain, k: int, stage_in: Mapping[str, np.ndarray], warmup: int,
                 repeat: int) -> list[float]:
    """Times of stage ``k`` as a chained pass runs it: an in-place stage on a fresh copy of its input each time
    (the copy made outside the timing, as the previous stage's output is fresh in a real pass)."""
    step = chain.inplace.get(k)
    if step is None:
        return call_times(lambda: chain.run_stage(k, dict(stage_in)), warmup, repeat)
    fresh = (lambda a: a.copy()) if chain.tensors is None else chain.tensors.fresh
    times = []
    for r in range(warmup + repeat):
        env = {**stage_in, step.input: fresh(stage_in[step.input])}
        t0 = time.perf_counter()
        chain.run_stage(k, env)
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def profile_dir(directory: str | Path, *, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                provider: str = "CPUExecutionProvider", warmup: int = 2, repeat: int = 5, threads: int = 0,
                seed: int = 0, progress: bool = True, whole: bool = True,
                length_histogram: str | Path | None = None, spinning: bool = False,
                inplace: bool = True, rounds: int = 3, device_tensors: bool | None = None) -> LatencyTable:
    """Profile a stage directory into a latency table (median per cell, monotone fit; see the module docstring).

    ``repeat`` timed runs per (stage, batch size) are spread over ``rounds`` interleaved rounds, at least one per
    round (``ceil(repeat / rounds)`` each); ``warmup`` untimed runs precede a cell's first round. The whole graph
    (``whole``) is timed in the same rounds and fitted the same way. ``meta["profile"]`` records
    ``{"rounds", "reps" (per round), "statistic": "median", "monotone_fit": true}``.

    ``device_tensors`` (None: on for any provider but the CPU's, as the backend's ``device_tensors: auto``): stage
    tensors stay on the provider's device between stages and the whole graph's outputs too, so that the table
    carries no host copies the served path does not make; model inputs are uploaded before the timed runs, for
    the stages and the whole graph alike. Every run with IO binding ends in onnxruntime's synchronisation, so the
    host's clock times the device's work. ``meta["device_tensors"]`` records the choice."""
    if warmup < 0 or repeat < 1 or rounds < 1:
        raise ConfigError(f"--warmup must be >= 0, --repeat >= 1 and rounds >= 1 (got {warmup}, {repeat}, "
                          f"{rounds})")
    d = Path(directory)
    manifest = load_manifest(d)
    if device_tensors is None:
        device_tensors = provider != "CPUExecutionProvider"
    chain = StageChain(d, manifest, [provider], threads=threads, whole=whole, spinning=spinning, inplace=inplace,
                       device_tensors=device_tensors)
    n = len(manifest["stages"])
    batch_sizes = sorted(batch_sizes)
    per_round = -(-repeat // rounds)  # ceil
    # model inputs per batch size, drawn once (small); intermediate tensors are recomputed each round, so memory
    # stays that of one batch size's chain
    rng = np.random.default_rng(seed)
    inputs = [random_feeds(manifest["graph_inputs"], b, rng) for b in batch_sizes]
    cells: list[list[list[float]]] = [[[] for _ in batch_sizes] for _ in range(n)]
    whole_cells: list[list[float]] = [[] for _ in batch_sizes]
    bar: Any = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=rounds * len(batch_sizes) * (n + int(whole)), desc=f"profile {manifest['model']}",
                   unit="run")
    try:
        for rnd in range(rounds):
            wu = warmup if rnd == 0 else 0
            for j, b in enumerate(batch_sizes):
                feeds = inputs[j]
                env: dict[str, Any] = dict(feeds)
                for k in range(n):
                    stage_in = chain.stage_feeds(k, env)
                    cells[k][j].extend(_stage_times(chain, k, stage_in, wu, per_round))
                    chain.run_stage(k, env, inplace=False)  # env keeps every tensor: the next stages' inputs
                    if bar is not None:
                        bar.update(1)
                del env
                if whole:
                    w = chain.whole
                    run_whole = ((lambda: w.run(None, feeds)) if chain.tensors is None
                                 else (lambda: chain.run_whole_resident(feeds)))
                    whole_cells[j].extend(call_times(run_whole, wu, per_round))
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    import onnxruntime as ort

    sizes = batch_sizes
    lat = [[statistics.median(c) for c in row] for row in cells]
    graph = ModelGraph(manifest["model"], [(st["name"], StageType.parse(st["type"])) for st in manifest["stages"]])
    meta: dict[str, Any] = {
        "source": "lazybatch profile", "provider": provider, "onnxruntime": ort.__version__,
        "warmup": warmup, "repeat": repeat, "statistic": "median", "threads": threads or os.cpu_count(),
        "profile": {"rounds": rounds, "reps": per_round, "statistic": "median", "monotone_fit": True},
        "intra_op_spinning": spinning,
        "device_tensors": device_tensors,  # stage tensors left on the provider's device between stages
        "inplace_stages": sorted(chain.inplace),  # residual stages timed writing over their input (sessions/inplace.py)
        "thread_pool": "global" if global_thread_pool() is not None else "per session",
        "host": platform.node(), "machine": platform.machine(), "processor": platform.processor() or None,
        "interpolation": "linear between measured batch sizes (LatencyTable)",
        "measured_batch_sizes": sizes,
        # stages cut after onnxruntime's optimiser (split --graph-optimization-level) cost less per stage
        "graph_optimization_level": (manifest.get("ort_optimization") or {}).get("level"),
    }
    prov = (f"lazybatch profile: onnxruntime {ort.__version__} {provider}, median of {rounds} interleaved rounds x "
            f"{per_round} runs after {warmup} warm-up runs, monotone fit, on {platform.node()} "
            f"({os.cpu_count()} CPUs)")
    table = LatencyTable(graph, sizes, lat, provenance=prov, meta=meta).monotone()
    lat = table.measured
    if whole:
        whole_lat = monotone_row(sizes, [statistics.median(c) for c in whole_cells])
        table.meta["whole_graph_latency_s"] = whole_lat
        table.meta["overhead_ratio"] = [sum(lat[k][j] for k in range(n)) / whole_lat[j] for j in range(len(sizes))]
    if length_histogram is None and graph.is_seq2seq:
        length_histogram = default_length_histogram((manifest.get("seq2seq") or {}).get("length_histogram"))
    if length_histogram is not None:
        from lazybatch.batcher.lengths import LengthHistogram

        h = LengthHistogram.load(length_histogram)
        table.meta["length_histogram"] = str(length_histogram)
        table.meta["dec_timesteps_90"] = h.coverage_length(0.9)
    return table


def plot_table(table: LatencyTable, path: str | Path) -> Path:
    """Per-sample latency (normalised to batch 1) and throughput against batch size: the paper's Fig. 3 shape."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'lazybatch[plots]' (or pass --no-plot)") from None
    sizes = list(table.batch_sizes)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for st in table.graph.stages:
        row = table.measured[st.index]
        ax1.plot(sizes, [v / b / row[0] for v, b in zip(row, sizes)], color="0.7", lw=0.8)
    total = [sum(table.measured[s][j] for s in range(table.graph.n)) for j in range(len(sizes))]
    ax1.plot(sizes, [v / b / total[0] for v, b in zip(total, sizes)], color="C0", lw=2, label="sum of stages")
    whole: Mapping[str, Any] | None = None
    if "whole_graph_latency_s" in table.meta:
        w = table.meta["whole_graph_latency_s"]
        whole = {"w": w}
        ax1.plot(sizes, [v / b / w[0] for v, b in zip(w, sizes)], color="C1", lw=2, ls="--", label="whole graph")
    ax1.plot([], [], color="0.7", lw=0.8, label="each stage")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("batch size")
    ax1.set_ylabel("latency per sample / latency at batch 1")
    ax1.set_title(f"{table.name}: per-sample cost")
    ax1.legend()
    ax2.plot(sizes, [b / v for v, b in zip(total, sizes)], color="C0", lw=2, marker="o", label="sum of stages")
    if whole:
        ax2.plot(sizes, [b / v for v, b in zip(whole["w"], sizes)], color="C1", lw=2, ls="--", marker="s",
                 label="whole graph")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch size")
    ax2.set_ylabel("throughput (samples/s)")
    ax2.set_title(str(table.meta.get("provider", "")))
    ax2.legend()
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
