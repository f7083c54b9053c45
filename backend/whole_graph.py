"""The whole ONNX graph in one onnxruntime session, on whatever Triton's own dynamic batcher grouped into one
``execute`` call: the real-world graph-batching baseline (``whole_graph: "true"``, the ``triton:<us>`` policies of
``lazybatch repo add``). No scheduler, no thread of its own.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from lazybatch.formats.example_dims import feed_shape

from .settings import BackendSettings
from .stages import available_providers, make_session

Outputs = dict[str, np.ndarray]


class WholeGraphExecutor:
    """One session of the whole graph, warmed up at its example shape; runs a group of validated requests as one
    batch and splits the answers back per request."""

    def __init__(self, settings: BackendSettings,
                 on_batch: Callable[[int, int, float], None] | None = None) -> None:
        s = settings
        self.session = make_session(s.whole_graph_model, available_providers(s.execution_provider),
                                    s.intra_op_threads)
        self.input_names = [t.name for t in s.inputs]
        self.output_names = [o.name for o in s.outputs]
        self.on_batch = on_batch  # (stage 0, batch size, onnxruntime seconds): the batch log
        # at the example sizes of dynamic dims (example_dims): a 1 there (a 1x1 image) fails in many graphs
        warm = {t.name: np.zeros((1, *feed_shape(t.dims, t.example)), t.dtype) for t in s.inputs}
        self.session.run(self.output_names, warm)

    def run(self, group: list[tuple[Outputs, int]]) -> list[Outputs] | str:
        """Each request's outputs, in order, or why onnxruntime failed (the whole group fails alike, as one batch
        does under Triton's batcher)."""
        feeds = {n: np.concatenate([t[n] for t, _ in group], axis=0) if len(group) > 1 else group[0][0][n]
                 for n in self.input_names}
        try:
            t0 = time.perf_counter()
            outs = dict(zip(self.output_names, self.session.run(self.output_names, feeds)))
            if self.on_batch is not None:
                self.on_batch(0, sum(b for _, b in group), time.perf_counter() - t0)
        except Exception as e:
            return str(e)
        answers: list[Outputs] = []
        row = 0
        for _, b in group:
            answers.append({k: v[row:row + b] for k, v in outs.items()})
            row += b
        return answers
