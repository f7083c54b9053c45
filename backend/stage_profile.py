"""The backend's quick profiler: a latency table measured on the stage sessions as served, when a model has none.

``lazybatch profile`` (onnx_tools/profile.py) is the offline tool with more options; this one runs at load time
(``profile_on_load``) and in ``lazybatch repo add``, on the ``StageRunner`` that will serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from lazybatch.batcher.latency_table import LatencyTable

if TYPE_CHECKING:
    from .stages import StageRunner


def profile_stages(runner: "StageRunner", batch_sizes: Sequence[int], *, reps: int = 3, warmup: int = 1,
                   provenance: str = "", rounds: int = 3) -> LatencyTable:
    """Median wall time of every stage at every batch size, fitted monotone, as a latency table.

    ``reps`` timed runs per (stage, batch size) are spread over ``rounds`` interleaved rounds (each round visits
    every stage at every batch size; at least one run per round, so ``reps=1`` still times 3 runs by default)
    and the median of all of them is kept. Why rounds: on a busy machine a burst of background load lasts a
    while; timed back to back, all repetitions of one cell fall inside it and the median cannot reject it,
    whereas spread over rounds the burst touches one round of several cells. The rows are then fitted with
    ``LatencyTable.monotone`` (non-decreasing in batch size, non-increasing per sample), which removes what
    spikes the median leaves. ``meta["profile"]`` records rounds, reps per round and the statistic."""
    sizes = sorted(set(batch_sizes) | {1})
    n_rounds = max(1, rounds)
    per_round = max(1, -(-max(1, reps) // n_rounds))  # ceil(reps / rounds)
    times: list[list[list[float]]] = [[[] for _ in sizes] for _ in range(runner.n_stages)]
    for rnd in range(n_rounds):
        for k, b in enumerate(sizes):
            tensors: dict[str, Any] = runner.sample_inputs(b)
            for spec in runner.manifest.stages:
                feeds = {i.name: tensors[i.name] for i in spec.inputs}
                step = runner.inplace.get(spec.index)
                if rnd == 0:
                    for _ in range(warmup):
                        runner.run_resident(spec.index, feeds)
                for _ in range(per_round):
                    # an in-place stage runs as served: on a fresh copy of its input (made outside the timing)
                    run_feeds = feeds if step is None else {**feeds, step.input: runner.fresh_copy(feeds[step.input])}
                    out, took = runner.timed(lambda: runner.run_resident(spec.index, run_feeds, owned=True))
                    times[spec.index][k].append(took)  # as served: on the device path
                tensors.update(out)
    rows = [[max(float(np.median(cell)), 1e-7) for cell in stage_times] for stage_times in times]
    graph = runner.manifest.graph()
    meta = {"profile": {"rounds": n_rounds, "reps": per_round, "statistic": "median", "monotone_fit": True}}
    return LatencyTable(graph, sizes, rows, meta=meta, provenance=provenance or (
        f"lazybatch backend profile, onnxruntime {runner.providers[0]}, median of {n_rounds} interleaved rounds "
        f"x {per_round} runs, monotone fit")).monotone()


def profile_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... and max_batch_size itself: the table interpolates in between."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch_size)
    return sizes
