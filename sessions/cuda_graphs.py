"""CUDA graphs per (stage, batch bucket): a sub-batch padded to its bucket replays one captured graph.

Why: on a GPU a stage's run costs its kernel launches plus Python and onnxruntime's own overhead, about 43 us per
stage boundary on an H200 with every tensor left on the device (docs/deploy.md). onnxruntime's CUDA provider can
capture a session's kernels once as a CUDA graph (``enable_cuda_graph``) and keeps one graph per ``gpu_graph_id``
run option, so one session serves several batch sizes. A captured graph replays on fixed shapes and fixed
addresses, which shapes this module, as vLLM and TensorRT-LLM shape theirs:

- batch sizes fall into buckets (powers of two up to the model's largest batch); a sub-batch of n rows runs in the
  smallest bucket b >= n, its last row repeated to fill the bucket, as graph batching pads;
- each (stage, bucket) has static input buffers (one Gather on the device writes the n rows and their padding into
  them) and static outputs, bound at the same addresses on every run;
- the first n rows of each output are copied out after the replay: the scheduler keeps a preempted sub-batch's
  tensors while another sub-batch runs the same stage, which would overwrite a static buffer;
- a stage onnxruntime will not capture (a node placed off the CUDA provider, control flow) is named and runs as
  before; so is one whose padded replay differs in any bit from its unpadded run on a warm-up batch (a node that
  mixes rows), checked at load, when every bucket is also captured, so the first request does not pay for it.

The graph sessions are second sessions of the stages (the plain ones keep serving the host path, profiling and
the load-time checks), so the weights are held twice on the device. With ``capture=False`` the same buffers,
padding, copies and check run without capture: how CI checks the mechanism on the CPU provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .device_tensors import DeviceTensors, Feed, Rows, rows_of


def graph_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch_size``, and it: a batch pads to at most twice its size."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    out, b = [], 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    return (*out, max_batch_size)


def bucket_of(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``n`` rows, or None (above the largest: run without a graph)."""
    for b in buckets:
        if b >= n:
            return b
    return None


@dataclass
class _Slot:
    """One (stage, bucket): its static buffers and the run options naming its graph."""

    inputs: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)  # filled by the first run (onnxruntime sizes them)
    options: Any = None
    runs: int = 0


class StageGraphs:
    """The graphs of one stage's session, one per bucket."""

    def __init__(self, session: Any, tensors: DeviceTensors, outputs: Sequence[str], buckets: Sequence[int], *,
                 capture: bool) -> None:
        self.session = session
        self.tensors = tensors
        self.outputs = list(outputs)
        self.buckets = tuple(sorted(buckets))
        self.capture = capture
        self._slots: dict[int, _Slot] = {}
        self.replays = 0  # counted for tests and the stats JSON

    def covers(self, n: int) -> bool:
        return bucket_of(n, self.buckets) is not None

    def run(self, feeds: Mapping[str, Feed]) -> dict[str, Any]:
        """One sub-batch through its bucket's graph; outputs are device tensors of exactly its rows."""
        n = rows_of(next(iter(feeds.values())))
        b = bucket_of(n, self.buckets)
        if b is None:
            raise ValueError(f"batch of {n} rows above the largest graph bucket {self.buckets[-1]}")
        slot = self._slots.get(b)
        dev = self.tensors
        if slot is None:
            slot = self._slots[b] = _Slot({k: dev.empty_like_rows(v, b) for k, v in feeds.items()},
                                          options=self._options(self.buckets.index(b)))
        for name, feed in feeds.items():
            dev.pad_into(feed, slot.inputs[name])
        io = self.session.io_binding()
        for name, buf in slot.inputs.items():
            io.bind_ortvalue_input(name, buf)
        if slot.outputs:
            for name in self.outputs:
                io.bind_ortvalue_output(name, slot.outputs[name])
        else:
            for name in self.outputs:
                io.bind_output(name, dev.device, dev.device_id)
        dev.launch(self.session, io, slot.options)
        if not slot.outputs:  # kept, so that every later run (the capture, the replays) binds the same addresses
            slot.outputs = dict(zip(self.outputs, io.get_outputs()))
        slot.runs += 1
        self.replays += 1
        return {name: dev.fresh(Rows(slot.outputs[name], 0, n)) for name in self.outputs}

    def _options(self, graph_id: int) -> Any:
        if not self.capture:
            return None
        import onnxruntime as ort

        ro = ort.RunOptions()
        ro.add_run_config_entry("gpu_graph_id", str(graph_id))
        return ro


def build_graphs(stages: Sequence[tuple[int, str]], open_session: Callable[[str], Any], tensors: DeviceTensors,
                 outputs_of: Callable[[int], Sequence[str]], buckets: Sequence[int], *, capture: bool,
                 warm_feeds: Callable[[int, int], dict[str, Feed]],
                 plain_run: Callable[[int, dict[str, Feed]], dict[str, Any]]) -> tuple[dict[int, StageGraphs], list[str]]:
    """Graphs for every stage that captures and answers as its plain run does, and why each other stage has none.

    ``stages``: (index, name); ``open_session(index)`` makes the stage's graph session (onnxruntime refuses one it
    cannot capture); ``warm_feeds(index, n)``: the stage's device inputs on a warm-up batch of n rows;
    ``plain_run``: the stage's ordinary device run, the reference."""
    graphs: dict[int, StageGraphs] = {}
    refused: list[str] = []
    for index, name in stages:
        try:
            sess = open_session(index)
        except Exception as e:  # noqa: BLE001 - onnxruntime's own types; the stage runs without a graph
            refused.append(f"{name}: onnxruntime will not capture it ({_short(e)})")
            continue
        g = StageGraphs(sess, tensors, outputs_of(index), buckets, capture=capture)
        why = _check(g, index, warm_feeds, plain_run)
        if why is None:
            graphs[index] = g
        else:
            refused.append(f"{name}: {why}")
    return graphs, refused


def _check(g: StageGraphs, index: int, warm_feeds: Callable[[int, int], dict[str, Feed]],
           plain_run: Callable[[int, dict[str, Feed]], dict[str, Any]]) -> str | None:
    """Capture every bucket; None where each padded replay equals the unpadded run bit for bit."""
    dev = g.tensors
    try:
        for b in g.buckets:
            for n in sorted({b, max(1, b - 1)}):  # a full bucket, and one padded by a row where b > 1
                feeds = warm_feeds(index, n)
                want = plain_run(index, feeds)
                for _ in range(2):  # the first runs capture; the second is a replay
                    got = g.run(feeds)
                for name, w in want.items():
                    hw, hg = dev.host(w), dev.host(got[name])
                    if hw.shape != hg.shape or hw.tobytes() != hg.tobytes():
                        return f"its replay at bucket {b} with {n} rows differs from the unpadded run"
    except Exception as e:  # noqa: BLE001 - a stage whose graph fails runs without one
        return f"its graph failed on a warm-up batch ({_short(e)})"
    g.replays = 0
    return None


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:240] if text else ''}"


def row_index(n: int, b: int) -> np.ndarray:
    """Rows 0..n-1, then row n-1 repeated up to b: the Gather that pads a sub-batch to its bucket."""
    return np.minimum(np.arange(b, dtype=np.int64), n - 1)
