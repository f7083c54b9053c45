"""One CUDA stream for every session of a model instance, and at most one stage run in flight on it.

Why: a plain ``run_with_iobinding`` ends by synchronising the host with its stream, so between two stages the GPU
idles while Python returns to the scheduler, which picks the next sub-batch and binds its tensors (about 43 us a
boundary on an H200 with IO binding, docs/deploy.md). With every session on one stream of ours
(onnxruntime's ``user_compute_stream``) and that synchronisation skipped
(``disable_synchronize_execution_providers``), the next stage is queued behind the running one, so the host's
work overlaps the device's.

What the scheduler still needs: a completion it can act on. Waiting for none would let the host queue a whole
chain before an urgent request could be seen, which would undo layer-level preemption. So ``RunWindow`` keeps at
most ``depth`` runs in flight (default one): after queuing run i the host waits for run i-1, then returns to the
scheduler, whose next decision overlaps run i. A preemption is then late by at most one stage that was already
queued. Model outputs wait for everything (``drain``) before they reach host memory.

The stream is a *blocking* CUDA stream, so that the copies onnxruntime makes on the legacy default stream (an
upload from numpy, ``OrtValue.numpy()``) stay ordered with it. It is made with cupy (an optional install: the
CUDA build's wheel, cupy-cuda12x or cupy-cuda13x); without cupy or off CUDA the feature is refused with a reason
(``StreamRefused``) and every run synchronises as before. Timings on the stream come from CUDA events
(``SharedStream.timed``), not from the host's enqueue time. Unmeasured on a GPU (docs/deploy.md).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Generic, Sequence, TypeVar

E = TypeVar("E")


class StreamRefused(RuntimeError):
    """Why this instance's sessions keep their own streams (logged once at load)."""


class RunWindow(Generic[E]):
    """At most ``depth`` queued runs not yet known complete: ``record`` marks a run's end (a CUDA event), ``wait``
    blocks the host until one has passed. Pure bookkeeping, so the rule is tested without a GPU."""

    def __init__(self, record: Callable[[], E], wait: Callable[[E], None], depth: int = 1) -> None:
        if depth < 0:
            raise ValueError("depth must be at least 0 (0: wait for every run, as without a shared stream)")
        self._record, self._wait, self.depth = record, wait, depth
        self._in_flight: deque[E] = deque()
        self.waits = 0  # host waits made, counted for the stats and tests

    def queued(self) -> None:
        """A run was just queued: mark it, then wait until at most ``depth`` runs are still in flight."""
        self._in_flight.append(self._record())
        while len(self._in_flight) > self.depth:
            self._wait(self._in_flight.popleft())
            self.waits += 1

    def drain(self) -> None:
        """Wait for every queued run (before host memory reads a result)."""
        while self._in_flight:
            self._wait(self._in_flight.popleft())
            self.waits += 1

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


class SharedStream:
    """A blocking CUDA stream (cupy) on one GPU, the run options that skip the end-of-run synchronisation, and the
    window of runs in flight on it."""

    def __init__(self, cupy: Any, device_id: int = 0, depth: int = 1) -> None:
        import onnxruntime as ort

        self._cupy = cupy
        self.device_id = device_id
        with cupy.cuda.Device(device_id):
            self._stream = cupy.cuda.Stream(non_blocking=False)
        self.ptr = int(self._stream.ptr)
        self.window: RunWindow[Any] = RunWindow(self._event, lambda ev: ev.synchronize(), depth)
        self._nosync = ort.RunOptions()
        self._nosync.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self._marked: set[int] = set()  # ids of caller's RunOptions already given the entry

    def provider_options(self) -> dict[str, str]:
        """The CUDA provider's options that put a session on this stream."""
        return {"user_compute_stream": str(self.ptr), "has_user_compute_stream": "1"}

    def run_options(self, options: Any = None) -> Any:
        """``options`` (or none) that skip the end-of-run synchronisation; a caller's own RunOptions (arena
        shrinking) get the entry once."""
        if options is None:
            return self._nosync
        if id(options) not in self._marked:
            options.add_run_config_entry("disable_synchronize_execution_providers", "1")
            self._marked.add(id(options))
        return options

    def _event(self) -> Any:
        ev = self._cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(self._stream)
        return ev

    def drain(self) -> None:
        self.window.drain()

    def timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """``fn()``'s result and the device time (seconds) of the work it queued, from two CUDA events."""
        self.drain()
        start = self._cupy.cuda.Event()
        end = self._cupy.cuda.Event()
        start.record(self._stream)
        out = fn()
        end.record(self._stream)
        end.synchronize()
        self.window.drain()
        return out, self._cupy.cuda.get_elapsed_time(start, end) / 1e3


def open_stream(providers: Sequence[str], device_id: int = 0, depth: int = 1) -> SharedStream:
    """The shared stream for sessions on ``providers[0]``, or ``StreamRefused`` saying why not."""
    if not providers or providers[0] != "CUDAExecutionProvider":
        raise StreamRefused("it needs the CUDA execution provider, and onnxruntime serves this model on "
                            f"{providers[0] if providers else 'no provider'}")
    try:
        import cupy
    except ImportError:
        raise StreamRefused("it needs cupy to make the stream (pip install cupy-cuda12x or cupy-cuda13x, the "
                            "build of onnxruntime-gpu's CUDA)") from None
    try:
        return SharedStream(cupy, device_id, depth)
    except Exception as e:  # noqa: BLE001 - cupy's CUDA errors: the reason, logged
        raise StreamRefused(f"cupy could not make a CUDA stream on GPU {device_id} ({type(e).__name__}: {e})") \
            from None
