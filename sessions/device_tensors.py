"""Stage tensors kept on the execution provider's device between stages (onnxruntime IOBinding).

Why: through ``session.run`` every stage copies its inputs to the device and its outputs back to host numpy. On an
H200 that made the CUDA stage chain 5.8x the whole graph at batch 1 and 17-19x at batch 8-64, while the same chain
with its tensors left on the device took 1.07-1.49x (docs/deploy.md). Here a stage's outputs stay ``OrtValue``s on
the device; a sample keeps a row of one, as on the host path (``backend/rows.py``); and a sub-batch is formed on
the device:

- rows that are consecutive rows of one tensor are bound by pointer (``Rows``): no copy, as ``join_rows`` slices;
- anything else is one ``Concat`` of such row ranges, run by a small session of its own on the same provider and
  cached per (parts, element type, rank);
- a model input is uploaded once, when a stage first needs it, and kept while its array lives;
- model outputs come back to host memory only at the end (``to_host``).

On the CPU provider the same code runs (uploads are free there: the ``OrtValue`` wraps the numpy memory), which is
how CI checks it against the host path bit for bit. No host synchronisation is added between stages: each
``run_with_iobinding`` ends as ``session.run`` does, unless the instance's sessions share one CUDA stream
(``stream``, cuda_stream.py): then a run is queued without it and the host waits only for the run before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from .cuda_stream import SharedStream


@dataclass(frozen=True)
class Rows:
    """Rows ``start .. start+n`` of a device tensor, bound by pointer: a sub-batch of consecutive rows, no copy."""

    value: Any  # an onnxruntime OrtValue on the device
    start: int
    n: int


Feed = Any  # what a resident stage takes per input: an OrtValue, ``Rows`` of one, or a host numpy array


def device_of(providers: Sequence[str]) -> str:
    """IOBinding's device name for the first provider: the device a session's tensors live on."""
    return "cuda" if providers and providers[0] == "CUDAExecutionProvider" else "cpu"


def provider_list(providers: Sequence[str], device_id: int = 0, *, cuda_graph: bool = False,
                  stream: SharedStream | None = None) -> list[Any]:
    """onnxruntime's providers argument: the CUDA provider on the GPU Triton assigned the instance
    (``model_instance_device_id``), not always GPU 0; ``cuda_graph``: its sessions capture CUDA graphs
    (cuda_graphs.py); ``stream``: its sessions run on one shared stream (cuda_stream.py)."""
    out: list[Any] = []
    for p in providers:
        opts = {}
        if p == "CUDAExecutionProvider":
            if device_id:
                opts["device_id"] = str(device_id)
            if cuda_graph:
                opts["enable_cuda_graph"] = "1"
            if stream is not None:
                opts.update(stream.provider_options())
        out.append((p, opts) if opts else p)
    return out


def _np_type(element_type: int) -> np.dtype:
    from onnx.helper import tensor_dtype_to_np_dtype

    return np.dtype(tensor_dtype_to_np_dtype(element_type))


class DeviceTensors:
    """Uploads, joins, binds and downloads the tensors of one model instance's sessions on one device."""

    def __init__(self, providers: Sequence[str], device_id: int = 0, *, intra_op_threads: int = 0,
                 stream: SharedStream | None = None) -> None:
        self.providers = list(providers)
        self.stream = stream  # every run queued on one shared stream, at most one in flight (cuda_stream.py)
        self.device = device_of(self.providers)
        self.device_id = device_id
        self.intra_op_threads = intra_op_threads
        self._uploads: dict[int, Any] = {}  # id(numpy array) -> its OrtValue on the device, while the array lives
        # on the CPU: id(numpy array) -> the OrtValue wrapping it, while someone holds that OrtValue
        self._wrapped: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._concat: dict[tuple[int, int, int], Any] = {}  # (parts, element type, rank) -> Concat session
        self._gather: dict[tuple[int, int], Any] = {}  # (element type, rank) -> Gather session (pad_into)
        self._indices: dict[tuple[int, int], Any] = {}  # (rows, bucket) -> the row index on the device
        self._index_arrays: list[Any] = []  # keeps each index's OrtValue alive with this object
        self.uploads = 0  # counted for tests and the stats JSON: a model input is uploaded once
        self.concats = 0

    # -- host to device -------------------------------------------------------------------------------------------
    def value(self, arr: Any) -> Any:
        """The device tensor for ``arr`` (an OrtValue as it is; a numpy array uploaded once per array)."""
        if not isinstance(arr, np.ndarray):
            return arr
        key = id(arr)
        got = self._uploads.get(key) or self._wrapped.get(key)
        if got is None:
            import onnxruntime as ort

            flat = np.ascontiguousarray(arr)
            got = ort.OrtValue.ortvalue_from_numpy(flat, self.device, self.device_id)
            if self.device == "cpu":  # the OrtValue wraps, and holds, the array: a strong entry would keep it alive
                if flat is arr:  # (a copy's wrapper could outlive ``arr`` and meet a new array at its address)
                    self._wrapped[key] = got
            else:
                self._uploads[key] = got
                weakref.finalize(arr, self._uploads.pop, key, None)
            self.uploads += 1
        return got

    # -- sub-batches ------------------------------------------------------------------------------------------------
    def join(self, parts: Sequence[tuple[Any, int]]) -> Feed:
        """The rows as one device batch: ``Rows`` (no copy) where they are consecutive rows of one tensor, else one
        Concat of row ranges on the device. A part is (tensor, row): the tensor an OrtValue, ``Rows`` (an in-place
        stage's output) or a host array (a model input)."""
        segs: list[list[Any]] = []  # [value, start, n]
        for t, k in parts:
            if isinstance(t, Rows):
                t, k = t.value, t.start + k
            v = self.value(t)
            last = segs[-1] if segs else None
            if last is not None and last[0] is v and last[1] + last[2] == k:
                last[2] += 1
            else:
                segs.append([v, k, 1])
        if len(segs) == 1:
            v, k, n = segs[0]
            return v if k == 0 and n == v.shape()[0] else Rows(v, k, n)
        return self._concat_run([Rows(v, k, n) for v, k, n in segs])

    def fresh(self, feed: Feed) -> Any:
        """A copy of ``feed`` on the device that the caller owns (profiling an in-place stage, as ``ndarray.copy``)."""
        if isinstance(feed, np.ndarray):
            import onnxruntime as ort

            return ort.OrtValue.ortvalue_from_numpy(feed.copy(), self.device, self.device_id)
        rows = feed if isinstance(feed, Rows) else Rows(feed, 0, feed.shape()[0])
        return self._concat_run([rows])

    def _concat_run(self, segs: list[Rows]) -> Any:
        first = segs[0].value
        key = (len(segs), first.element_type(), len(first.shape()))
        sess = self._concat.get(key)
        if sess is None:
            sess = self._concat[key] = self._concat_session(*key)
        io = sess.io_binding()
        for j, r in enumerate(segs):
            self.bind(io, f"x{j}", r)
        io.bind_output("y", self.device, self.device_id)
        self.launch(sess, io)
        self.concats += 1
        return io.get_outputs()[0]

    def _concat_session(self, k: int, element_type: int, rank: int) -> Any:
        """Concat of k tensors along the batch axis, dims symbolic, on this device's provider."""
        from onnx import helper

        dims = lambda j: [f"d{d}_{j}" for d in range(rank)]  # noqa: E731 - symbolic, every part its own
        inputs = [helper.make_tensor_value_info(f"x{j}", element_type, dims(j)) for j in range(k)]
        out = helper.make_tensor_value_info("y", element_type, [f"y{d}" for d in range(rank)])
        node = helper.make_node("Concat", [f"x{j}" for j in range(k)], ["y"], axis=0)
        return self._small_session(helper.make_graph([node], f"lazybatch_join_{k}", inputs, [out]))

    def _small_session(self, graph: Any) -> Any:
        """A one-node helper graph as a session on this device's provider, one thread."""
        import onnx
        import onnxruntime as ort
        from onnx import helper

        from .threads import session_options

        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = min(model.ir_version, 8)
        onnx.checker.check_model(model)
        return ort.InferenceSession(model.SerializeToString(), sess_options=session_options(1),
                                    providers=provider_list(self.providers, self.device_id, stream=self.stream))

    # -- padded static buffers (sessions/cuda_graphs.py) -------------------------------------------------------------
    def empty_like_rows(self, feed: Feed, rows: int) -> Any:
        """A device tensor of ``rows`` rows shaped and typed as ``feed``'s rows: a graph's static input buffer."""
        import onnxruntime as ort

        if isinstance(feed, np.ndarray):
            shape, dtype = feed.shape[1:], feed.dtype
        else:
            v = feed.value if isinstance(feed, Rows) else feed
            shape, dtype = v.shape()[1:], _np_type(v.element_type())
        return ort.OrtValue.ortvalue_from_shape_and_type([rows, *shape], dtype, self.device, self.device_id)

    def pad_into(self, feed: Feed, into: Any) -> None:
        """Write ``feed``'s n rows into ``into`` (b >= n rows), the last row repeated to fill it: one Gather on the
        device, its row index uploaded once per (n, b)."""
        from .cuda_graphs import row_index

        n, b = rows_of(feed), into.shape()[0]
        idx = self._indices.get((n, b))
        if idx is None:
            idx = self._indices[(n, b)] = self.value(row_index(n, b))
            self._index_arrays.append(idx)
        v = feed if not isinstance(feed, np.ndarray) else self.value(feed)
        elem = (v.value if isinstance(v, Rows) else v).element_type()
        rank = len((v.value if isinstance(v, Rows) else v).shape())
        sess = self._gather.get((elem, rank))
        if sess is None:
            sess = self._gather[(elem, rank)] = self._small_session(_gather_graph(elem, rank))
        io = sess.io_binding()
        self.bind(io, "x", v)
        io.bind_ortvalue_input("i", idx)
        io.bind_ortvalue_output("y", into)
        self.launch(sess, io)

    # -- binding ----------------------------------------------------------------------------------------------------
    def bind(self, io: Any, name: str, feed: Feed) -> None:
        """Bind one input: an OrtValue as it is, ``Rows`` by pointer into its tensor, a host array uploaded."""
        if isinstance(feed, Rows):
            io.bind_input(name, self.device, self.device_id, *_pointer(feed))
        else:
            io.bind_ortvalue_input(name, self.value(feed))

    def bind_over(self, io: Any, name: str, feed: Feed) -> None:
        """Bind output ``name`` to ``feed``'s own memory (an in-place stage writes over its input)."""
        if isinstance(feed, Rows):
            io.bind_output(name, self.device, self.device_id, *_pointer(feed))
        else:
            io.bind_ortvalue_output(name, feed)

    # -- running a session ------------------------------------------------------------------------------------------
    def run(self, sess: Any, feeds: dict[str, Feed], outputs: Sequence[str], *, over: tuple[str, Any] | None = None,
            options: Any = None) -> list[Any]:
        """One run of ``sess`` with every tensor on the device: ``feeds`` bound, ``outputs`` left on the device
        (OrtValues). ``over`` = (output, a device feed): that output is written over the feed's memory (an in-place
        residual stage) and the feed itself is returned for it. The served path and the profiler share this."""
        io = sess.io_binding()
        for name, feed in feeds.items():
            self.bind(io, name, feed)
        if over is not None:
            self.bind_over(io, *over)
            self.launch(sess, io, options)
            return [over[1]]
        for name in outputs:
            io.bind_output(name, self.device, self.device_id)
        self.launch(sess, io, options)
        return list(io.get_outputs())

    def launch(self, sess: Any, io: Any, options: Any = None) -> None:
        """``run_with_iobinding``; on a shared stream queued without the end-of-run synchronisation, the host
        waiting only while more than one run is in flight (cuda_stream.py)."""
        if self.stream is None:
            sess.run_with_iobinding(io, options)
            return
        sess.run_with_iobinding(io, self.stream.run_options(options))
        self.stream.window.queued()

    # -- device to host ---------------------------------------------------------------------------------------------
    def host(self, feed: Feed) -> np.ndarray:
        """One device tensor (or ``Rows`` of one) as a host array that owns its memory."""
        if isinstance(feed, np.ndarray):
            return feed.copy()
        if isinstance(feed, Rows):
            feed = self._concat_run([feed])
        if self.stream is not None:  # host memory reads it: everything queued first
            self.stream.drain()
        out = feed.numpy()  # on the CPU a view of onnxruntime's buffer: copied so the answer owns its memory
        return out.copy() if self.device == "cpu" else out

    def to_host(self, parts: Sequence[tuple[Any, int]]) -> np.ndarray:
        """The rows as one host array that owns its memory (the answer Triton copies out)."""
        return self.host(self.join(parts))


def _gather_graph(element_type: int, rank: int) -> Any:
    """y = x[i] along the batch axis: rows picked (and repeated) by an int64 index."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", element_type, [f"x{d}" for d in range(rank)])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b"])
    y = helper.make_tensor_value_info("y", element_type, ["b", *(f"x{d}" for d in range(1, rank))])
    return helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], "lazybatch_pad", [x, i], [y])


def _pointer(rows: Rows) -> tuple[np.dtype, list[int], int]:
    """(element type, shape, address) of ``rows`` inside its tensor: what IOBinding binds by pointer."""
    v = rows.value
    shape = v.shape()
    dtype = _np_type(v.element_type())
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    return dtype, [rows.n, *shape[1:]], v.data_ptr() + rows.start * row_bytes


def rows_of(t: Any) -> int:
    """The batch size of a stage tensor on either path: a host array, an OrtValue or ``Rows``."""
    if isinstance(t, Rows):
        return t.n
    return t.shape[0] if isinstance(t, np.ndarray) else t.shape()[0]
