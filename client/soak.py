"""Open-loop load with exact per-request accounting, server memory, and metric scrapes: for overload, fault and
soak runs (tests/triton/test_ops_server.py, benchmarks/bench_soak.py).

Unlike ``load.py`` (latency percentiles for comparisons) this counts every response per request, so that a lost or
duplicated response shows up as a number, and it classifies errors the way operators see them: rejected at
admission (UNAVAILABLE "rejected: ..."), failed (INTERNAL), unavailable (unloaded), other.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np


@dataclass
class Outcome:
    sent: float  # time.monotonic() when sent
    answers: int = 0
    latency: float | None = None
    error: str | None = None
    kind: str = ""  # ok | rejected | error | unavailable | other


@dataclass
class Phase:
    """What one ``OpenLoop.run`` sent and got back."""

    name: str
    rate: float
    outcomes: dict[int, Outcome] = field(default_factory=dict)

    def count(self, kind: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.kind == kind)

    @property
    def lost(self) -> int:
        return sum(1 for o in self.outcomes.values() if o.answers == 0)

    @property
    def duplicated(self) -> int:
        return sum(1 for o in self.outcomes.values() if o.answers > 1)

    def latency_ms(self, q: float, kind: str = "ok") -> float:
        """The ``q``-th percentile latency of the requests answered ``kind`` (ok: served; rejected: refused)."""
        lat = [o.latency for o in self.outcomes.values() if o.kind == kind and o.latency is not None]
        return float(np.percentile(lat, q) * 1e3) if lat else float("nan")

    def late(self, sla_s: float) -> int:
        """Served requests whose latency (as the client saw it) exceeded ``sla_s``: promises not kept."""
        return len(self.late_sent_at(sla_s))

    def late_sent_at(self, sla_s: float) -> list[float]:
        """When each late request (``late``) was sent, in seconds after the phase's first: where a stall hit."""
        if not self.outcomes:
            return []
        t0 = min(o.sent for o in self.outcomes.values())
        return sorted(o.sent - t0 for o in self.outcomes.values()
                      if o.kind == "ok" and o.latency is not None and o.latency > sla_s)

    def summary(self) -> dict[str, Any]:
        n = len(self.outcomes)
        return {"phase": self.name, "rate": self.rate, "sent": n, "ok": self.count("ok"),
                "rejected": self.count("rejected"), "error": self.count("error"),
                "unavailable": self.count("unavailable"), "other": self.count("other"), "lost": self.lost,
                "duplicated": self.duplicated, "p50_ms": self.latency_ms(50), "p99_ms": self.latency_ms(99),
                "rejected_p50_ms": self.latency_ms(50, "rejected"), "rejected_p99_ms": self.latency_ms(99, "rejected")}


def classify(error: str | None) -> str:
    if error is None:
        return "ok"
    e = error.lower()
    if "rejected:" in e:
        return "rejected"
    if "unloaded" in e or "not found" in e or "unavailable" in e or "not ready" in e:
        return "unavailable"
    if "stage" in e and "failed" in e:
        return "error"
    return "other"


class OpenLoop:
    """Poisson (or even) arrivals on async gRPC; every callback is counted against its request."""

    def __init__(self, url: str, model: str, make_input: Callable[[int], dict[str, np.ndarray]], *,
                 parameters: dict[str, Any] | None = None, seed: int = 0) -> None:
        import tritonclient.grpc as grpcclient

        self.grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(url)
        self.model = model
        self.make_input = make_input
        self.parameters = parameters
        self.rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._ids = 0
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def _callback(self, phase: Phase, i: int) -> Callable[[Any, Any], None]:
        def done(result: Any, error: Any) -> None:
            now = time.monotonic()
            with self._lock:
                o = phase.outcomes[i]
                o.answers += 1
                if o.answers == 1:
                    o.latency = now - o.sent
                    o.error = None if error is None else str(error)
                    o.kind = classify(o.error)
                    self._pending -= 1
                    self._idle.notify_all()
        return done

    def send(self, phase: Phase) -> int:
        with self._lock:
            i = self._ids
            self._ids += 1
            phase.outcomes[i] = Outcome(time.monotonic())
            self._pending += 1
        tensors = []
        for name, arr in self.make_input(i).items():
            t = self.grpc.InferInput(name, list(arr.shape), "FP32")
            t.set_data_from_numpy(arr)
            tensors.append(t)
        try:
            self.client.async_infer(self.model, tensors, self._callback(phase, i), parameters=self.parameters)
        except Exception as e:  # the call itself failed: that is its one answer
            self._callback(phase, i)(None, e)
        return i

    def run(self, name: str, rate: float, duration: float, *, poisson: bool = True,
            progress: Callable[[float], None] | None = None) -> Phase:
        """Send at ``rate`` requests/s for ``duration`` seconds (open loop: never waits for answers)."""
        phase = Phase(name, rate)
        start = time.monotonic()
        t_next = start
        while True:
            now = time.monotonic()
            if now >= start + duration:
                break
            if now < t_next:
                time.sleep(min(t_next - now, 0.05))
                continue
            self.send(phase)
            gap = self.rng.exponential(1.0 / rate) if poisson else 1.0 / rate
            t_next += gap
            if progress is not None:
                progress(now - start)
        return phase

    def wait_idle(self, timeout: float) -> bool:
        """Until every request sent has its answer (False if some are still out after ``timeout`` s)."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._pending > 0:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        self.client.close()


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (tritonserver and its Python backend stubs)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def process_rss(pid: int) -> int:
    """Resident memory of one process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_tree_rss(pid: int) -> int:
    """Resident memory in bytes of ``pid`` and all its descendants (tritonserver + Python backend stubs)."""
    return sum(process_rss(p) for p in process_tree(pid))


def process_label(pid: int) -> str:
    """A short name: ``tritonserver``, or ``stub:<model>`` for a Python backend stub (its model path is an argument)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return str(pid)
    if not argv:
        return str(pid)
    name = os.path.basename(argv[0])
    if "python_backend_stub" in name and len(argv) > 1:
        parts = argv[1].rstrip("/").split("/")  # .../<model>/<version>/model.py
        return f"stub:{parts[-3] if len(parts) >= 3 else argv[1]}"
    return name


def scrape(url: str, timeout: float = 5.0) -> str:
    """One scrape of Triton's metrics endpoint (http://host:8002/metrics)."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def metric_total(text: str, family: str, **labels: str) -> float:
    """Sum of the series of ``family`` whose labels include ``labels``."""
    from lazybatch.formats.prometheus import parse_samples

    return sum(v for lab, v in parse_samples(text, family) if all(lab.get(k) == w for k, w in labels.items()))


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def phases_table(phases: Iterable[Phase]) -> str:
    rows = [p.summary() for p in phases]
    head = ["phase", "rate", "sent", "ok", "rejected", "error", "unavailable", "other", "lost", "duplicated",
            "p50_ms", "p99_ms"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[h]:.1f}" if isinstance(r[h], float) else str(r[h]) for h in head) + " |")
    return "\n".join(out)
