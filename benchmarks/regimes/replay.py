"""The latency table the policies read: its batch-scaling curve and regime, and the run's loads replayed on it on
a virtual clock (no serving cost), to tell a goal the algorithm misses from one serving loses."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.regimes.policies import Settings
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.lazy import DEFAULT_MIN_BATCH_GAIN, useful_batch_size
from lazybatch.simulator.loads_on_table import BASELINES as SIM_BASELINES, simulate_loads


def scaling_curve(table: LatencyTable, max_batch: int) -> dict:
    """Whole-program latency (sum of the stages) per measured batch size, per-sample latency, gain, regime."""
    sizes = list(table.batch_sizes)
    whole = [sum(row[b] for row in table.dense) * 1e3 for b in sizes]
    per_sample = [w / b for w, b in zip(whole, sizes)]
    gain = per_sample[0] / min(per_sample)
    sc = {"batch_sizes": sizes, "whole_ms": whole, "per_sample_ms": per_sample, "t1_ms": whole[0], "gain": gain}
    return sc | {"regime": regime_of(sc, max_batch)}


def regime_of(sc: dict, max_batch: int) -> str:
    """The regime of a scaling curve by the current rule (results files keep the one of the day they were written)."""
    return regime(sc["gain"], batch_cap(sc, max_batch))


def regime(gain: float, cap: int) -> str:
    """"No batching gain" is where lazy's own rule (useful_batch_size) caps batches at 1, so that the page and
    the scheduler agree on it: a model lazy does batch (BERT here, 1.2-1.3x) is judged by the batching goals,
    however small its gain. A fixed gain threshold put BERT on either side between two profiles of it."""
    if cap == 1:
        return "no batching gain"
    return "batching pays" if gain >= 2.0 else "batching pays a little"


# Seeds x requests per simulated cell: the figures of a 1000-request run move by about a percent between seeds.
SIM_SEEDS, SIM_REQUESTS = 3, 1000


def lazy_table_path(repo: Path, kind: str) -> Path:
    """The latency table the run's scheduled policies read (one table, shared by all of them): lazy's model
    directory's, or, where --policies left lazy out, the first other model directory that has one (Triton's
    configurations have none)."""
    lazy = repo / f"{kind}_lazy" / "1" / "latency.json"
    if lazy.exists():
        return lazy
    return next(iter(sorted(repo.glob(f"{kind}_*/1/latency.json"))), lazy)


def sim_best(by: dict, f: float) -> str:
    """The simulated graph batcher with the lowest average latency at load ``f``."""
    return min(SIM_BASELINES, key=lambda p: by[(p, f)]["avg_ms"])


def simulated(table: LatencyTable, loads: list[float], st: Settings) -> dict:
    """The same loads on a virtual clock with the table the policies read (lazybatch/simulator/loads_on_table.py):
    what the algorithm gives with no serving cost, to tell a goal the algorithm misses from one serving loses."""
    return simulate_loads(table, loads, max_batch_size=table.max_batch_size, sla_multiples=st.sla_multiples,
                          sched_multiple=st.sched_sla_multiple, seeds=SIM_SEEDS, requests=SIM_REQUESTS).as_dict()


def add_simulated(res: dict, st: Settings, results_dir: Path | None) -> None:
    """Fill in the simulated figures of a result that predates them, from the latency table its run kept."""
    if "simulated" in res:
        return
    if "latency_table" not in res and results_dir is not None:
        path = lazy_table_path(results_dir / "repos" / res["model"], res["model"])
        if not path.exists():
            return
        res["latency_table"] = json.loads(path.read_text())
    if "latency_table" in res:
        table = LatencyTable.from_dict(res["latency_table"])
        res["simulated"] = simulated(table, sorted({c["load"] for c in res["cells"]}), st)


def batch_cap(sc: dict, max_batch: int, min_gain: float = DEFAULT_MIN_BATCH_GAIN) -> int:
    """lazy's batch cap, by the policy's own rule (useful_batch_size), from the whole-program curve on the page."""
    from lazybatch.batcher.graph import ModelGraph, StageType

    whole = [ms * 1e-3 for ms in sc["whole_ms"]]
    table = LatencyTable(ModelGraph("whole", [("whole", StageType.STATIC)]), sc["batch_sizes"], [whole])
    return useful_batch_size(table, max_batch, min_gain)
