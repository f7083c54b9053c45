"""The same cells offered by NVIDIA perf_analyzer (`lazybatch perf`): three windows, Poisson, --async."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import triton_stats
from benchmarks.regimes.policies import SEQ2SEQ_KINDS, Settings, SLA_AWARE


def perf_binary() -> Path:
    from lazybatch import perf as pa

    return pa.find_perf_analyzer() or pa.install()


def perf_cell(perf: Path | None, kind: str, p: str, m: str, f: float, rate: float, url: str, http: str,
              stats_dir: Path, st: Settings, sched_sla: float, slas: list[float]) -> dict:
    """perf_analyzer at one rate: exactly three measurement windows (stability check off), Poisson, --async."""
    from lazybatch import perf as pa
    from lazybatch.batcher.errors import ConfigError

    input_data = "zero"
    if kind in SEQ2SEQ_KINDS:  # valid token ids and drawn lengths (random data would be outside the vocabulary)
        from lazybatch.client.seq2seq import http_parameters, info_from_parameters, perf_input_data

        with urllib.request.urlopen(f"http://{http}/v2/models/{m}/config", timeout=10) as resp:
            info = info_from_parameters(http_parameters(json.loads(resp.read())))
        path = (st.out / "perf" / kind / f"input_{m}.json").resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(perf_input_data(info, seed=st.seed)))
        input_data = str(path)
    tb = triton_stats(http, m)
    t0 = time.monotonic()
    row, err = None, None
    try:
        rows, _ = pa.run(perf, m, url, [rate], st.out / "perf" / kind / f"{int(round(f * 100))}",
                         measurement_ms=st.perf_measurement_ms, max_trials=3, stability_percentage=10000,
                         sla_ms=sched_sla if p in SLA_AWARE else None,
                         input_data=input_data)
        row = rows[0] if rows else None
    except ConfigError as e:
        err = str(e).splitlines()[-1][:200]
    wall = time.monotonic() - t0
    time.sleep(0.2)  # let Triton count the last answers (see settled_stats)
    ta = triton_stats(http, m)
    served = ta["success"] + ta["fail"] - tb["success"] - tb["fail"]
    out: dict[str, Any] = {"model": kind, "policy": p, "load": f, "rate": rate, "wall_s": wall,
                           "server_requests": served, "error": err}
    if row is not None:
        out.update({"throughput": row.throughput, "avg_ms": row.avg_ms, "p50_ms": row.p50_ms,
                    "p99_ms": row.p99_ms, "server_queue_ms": row.server_queue_ms,
                    "server_compute_ms": row.server_compute_ms})
    return out
