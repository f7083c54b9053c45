"""What one simulated run measured, and how runs over several seeds are summarised."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from lazybatch.batcher.request import Request, Status

from .energy import per_request


@dataclass
class RunMetrics:
    requests: int
    completed: int
    throughput: float  # completed requests / (last completion - first arrival), requests/s
    avg_latency: float
    p50_latency: float
    p90_latency: float
    p99_latency: float
    max_latency: float
    queue_p50: float
    queue_p90: float
    queue_p99: float
    violations: dict[float, float]  # SLA target (s) -> fraction of requests over it (or failed)
    own_sla_violation: float  # against each request's own deadline
    mean_batch: float  # mean batch size over executed stage jobs
    batch_hist: dict[int, int]
    stage_execs: int
    decisions: dict[str, int] = field(default_factory=dict)
    energy_mj_per_req: float = float("nan")  # modelled (NPU tables only), see energy.py
    req_per_joule: float = float("nan")
    latencies: list[float] | None = None


def measure(reqs: Sequence[Request], *, sla_targets: Iterable[float], batch_hist: dict[int, int],
            stage_execs: int, decisions: dict[str, int], keep_latencies: bool = False,
            energy_j: float | None = None) -> RunMetrics:
    ok = [r for r in reqs if r.status is Status.OK]
    lat = np.array([r.finish - r.arrival for r in ok]) if ok else np.array([np.nan])
    qd = np.array([r.start - r.arrival for r in ok if r.start is not None]) if ok else np.array([np.nan])
    n = len(reqs)
    span = max(r.finish for r in reqs) - min(r.arrival for r in reqs) if reqs else 0.0
    failed = n - len(ok)
    viol = {}
    for s in sla_targets:
        viol[float(s)] = (int((lat > s).sum()) + failed) / n if n else 0.0
    own = (sum(1 for r in ok if r.finish > r.deadline) + failed) / n if n else 0.0
    execs = sum(batch_hist.values())
    mean_b = sum(b * c for b, c in batch_hist.items()) / execs if execs else 0.0
    p50, p90, p99 = np.percentile(lat, [50, 90, 99])
    q50, q90, q99 = np.percentile(qd, [50, 90, 99])
    mj, rpj = per_request(energy_j, len(ok))
    return RunMetrics(
        requests=n, completed=len(ok), throughput=len(ok) / span if span > 0 else float("nan"),
        avg_latency=float(lat.mean()), p50_latency=float(p50), p90_latency=float(p90), p99_latency=float(p99),
        max_latency=float(lat.max()), queue_p50=float(q50), queue_p90=float(q90), queue_p99=float(q99),
        violations=viol, own_sla_violation=own, mean_batch=mean_b, batch_hist=dict(sorted(batch_hist.items())),
        stage_execs=stage_execs, decisions=dict(decisions), energy_mj_per_req=mj, req_per_joule=rpj,
        latencies=[float(x) for x in lat] if keep_latencies else None)
