"""What a served model writes for benchmarks and tests under ``LAZYBATCH_STATS_DIR``: one CSV line per executed
batch (``BatchLog``), one per cancelled answer (``CancelLog``), and the runtime's statistics as JSON
(``StatsFile``), read back with ``read_log`` and ``json``. All best effort: a full disk never fails a request.

Why files: the server runs each model in a stub process of its own, and a benchmark in another process wants what
happened inside (batch sizes over time, when a cancellation was answered, the scheduler's decision counts) without a
protocol of its own. Unset, none of this is written.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable


def read_log(path: Path) -> list[list[str]]:
    """The comma-separated fields of every complete line of a stats log (``BatchLog``, ``CancelLog``).

    The backend appends while benchmarks and tests read, so the text after the last newline may be a line still
    being written: it is left for the next read. A missing file reads as no lines."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [line.split(",") for line in text[:text.rfind("\n") + 1].splitlines() if line]


class BatchLog:
    """One CSV line per executed batch (unix time at its end, stage, batch size, onnxruntime seconds), appended to
    ``<model>.batches.csv``: what benchmarks plot as batch size over time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: Any = None

    def record(self, stage: int, size: int, seconds: float) -> None:
        self._line(f"{time.time():.6f},{stage},{size},{seconds:.6f}")

    def _line(self, text: str) -> None:
        try:
            with self._lock:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = self.path.open("ab", buffering=0)
                self._file.write((text + "\n").encode())  # one unbuffered append per line: readers see whole lines
        except OSError as e:
            print(f"lazybatch: cannot write {self.path.name}: {e}", file=sys.stderr)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class CancelLog(BatchLog):
    """One CSV line per CANCELLED answer (unix time as it is sent, the client's request id), appended to
    ``<model>.cancels.csv``: a client that cancels gets its own answer at once from its gRPC library, so when the
    server answered is only seen here (benchmarks/bench_cancel.py)."""

    def record_cancel(self, request_id: str) -> None:
        self._line(f"{time.time():.6f},{request_id.replace(',', ';')}")


class StatsFile:
    """``<model>.json``: the runtime's counters, rewritten whole (through a temporary file) at quiet moments."""

    def __init__(self, path: Path, header: dict[str, Any], gate: Callable[[], Any]) -> None:
        self.path = path
        self.header = header  # the model, its policy and why its stages run fused, if they do
        self.gate = gate  # the device group's gate once joined (None: solo or ungrouped)

    def write(self, runtime: Any) -> Callable[[], None]:
        """The counters now (under the runtime's lock, where they hold still); returns what writes them to the file,
        which the scheduler thread calls after letting go of the lock (the JSON and the file took 0.6-1.3 ms of it
        served under load, ad hoc: requests that came meanwhile waited)."""
        data = {**self.header,
                "scheduler": runtime.policy.describe(),  # with what it made of the table, e.g. its batch cap
                **runtime.stats.as_dict(),
                # the scheduler's decision counts: dispatch, preempt, merge, split, reject
                "decisions": dict(runtime.scheduler.log.counts)}
        if hasattr(runtime.runner, "npu_stats"):
            data["npu"] = runtime.runner.npu_stats()
        gate = self.gate()
        if gate is not None:  # a grouped model: its use of the shared device (the metrics' device families)
            data["device"] = {"device_s": gate.device_s, "wait_s": gate.wait_s, "grants": gate.grants,
                              "leased": bool(gate.leased)}
        return lambda: self._save(data)

    def _save(self, data: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(self.path)
        except OSError as e:  # statistics are best effort
            print(f"lazybatch: cannot write stats: {e}", file=sys.stderr)


class StatsLogs:
    """The three files of one model, or none where ``LAZYBATCH_STATS_DIR`` is unset."""

    def __init__(self, name: str, directory: str | None = None) -> None:
        d = directory if directory is not None else os.environ.get("LAZYBATCH_STATS_DIR")
        self.dir = Path(d) if d else None
        self.name = name
        self.batches = BatchLog(self.dir / f"{name}.batches.csv") if self.dir else None
        self.cancels = CancelLog(self.dir / f"{name}.cancels.csv") if self.dir else None

    def stats_file(self, header: dict[str, Any], gate: Callable[[], Any]) -> StatsFile | None:
        return StatsFile(self.dir / f"{self.name}.json", header, gate) if self.dir else None

    def close(self) -> None:
        for log in (self.batches, self.cancels):
            if log is not None:
                log.close()
