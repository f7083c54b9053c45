"""Responses sent on a thread of their own (config parameter ``response_thread``, default true).

pb_utils' ``ResponseSender.send`` is a round trip: the stub writes the response into shared memory, sends an IPC
message and waits until the Triton process has taken it (python_backend's src/response_sender.cc; it releases the
GIL while it waits). Sent from the scheduler thread, every response stalls the next stage for that round trip: at
hundreds of responses a second on a busy machine, that is a large share of the thread's time. Here the scheduler
thread only queues the answer; this thread builds and sends it, in the order answers were given, while the
scheduler runs the next stage (onnxruntime releases the GIL too).

Nothing is lost: ``close`` sends everything queued before it returns, and a response that cannot be sent is logged
and does not stop the thread. ``response_thread: false`` sends inline, as before (one thread fewer to reason
about when debugging).
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from typing import Any, Callable

_STOP = object()


class ResponseThread:
    """A FIFO of answers and the one thread that sends them."""

    def __init__(self, send: Callable[..., None], *, name: str = "lazybatch-responder") -> None:
        self._send = send
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def __call__(self, *args: Any) -> None:
        """Queue one answer (the arguments ``send`` takes); sent inline once the thread is closed, so that a late
        answer (e.g. from a runtime closed after this) still reaches its client."""
        with self._lock:
            if not self._closed:
                self._queue.put(args)
                return
        self._deliver(args)

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():  # pragma: no cover - a send that never returns; say so rather than hang
            print(f"lazybatch: {self._thread.name}: responses still being sent after {timeout:g} s",
                  file=sys.stderr)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            self._deliver(item)

    def _deliver(self, args: tuple[Any, ...]) -> None:
        try:
            self._send(*args)
            self.sent += 1
        except Exception:  # one response that cannot be sent (client gone, bad tensor) must not stop the others
            self.failed += 1
            traceback.print_exc()
