"""Which route eager's requests take under load: a diagnostic, not a benchmark (one run, no repetitions).

    python -m benchmarks.probes.probe_routes lazybatch-results/default/repos/mobilenet --loads 1.2,2.0 --models eager,triton_0us

Serves a repository that bench_default.py built (KIND_eager beside KIND_triton_0us, ...) with the backend's statistics
on (``LAZYBATCH_STATS_DIR``), drives each model with `lazybatch load`'s open-loop Poisson client at each load (a
fraction of the batch-1 rate measured on KIND_triton_0us), and prints per cell the client's average, p99 and
throughput, Triton's requests per execute call (its own metrics), and for eager models the backend's counts: passes
run inline in ``execute`` and groups they served (``inline_runs``/``inline_groups``), groups that waited for the
scheduler (``inline_waits``), why groups went to the scheduler instead (``inline_refused``), and the batch sizes.
With ``--cpu``, also the CPU time per answered request of tritonserver and of each model's stub process (from
/proc, Linux only): where one policy's passes cost more than another's with the same groups, this says which process
spends it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import served
from benchmarks.harness.procs import cpu_seconds, processes
from lazybatch.client.api import Client
from lazybatch.client.load import run_load

KEYS = ("requests", "inline_runs", "inline_groups", "inline_waits", "inline_refused", "span_runs", "batch_hist",
        "host_per_job_ms")


def triton_counts(metrics_url: str, model: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    out = {}
    for fam in ("nv_inference_request_success", "nv_inference_exec_count"):
        m = re.search(fam + r'\{model="%s",version="1"\} ([0-9.e+]+)' % re.escape(model), text)
        out[fam] = float(m.group(1)) if m else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path, help="a repository bench_default.py built: OUT/repos/KIND")
    ap.add_argument("--loads", default="1.2,2.0", help="fractions of the batch-1 rate")
    ap.add_argument("--models", default="eager,triton_0us", help="policy suffixes of KIND_<suffix>, in turn")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of load per cell")
    ap.add_argument("--cpu", action="store_true", help="CPU ms per answered request of tritonserver and each stub")
    args = ap.parse_args(argv)
    kind = args.repo.name
    stats = Path(tempfile.mkdtemp(prefix="lazybatch-stats-"))
    seen: dict[str, dict[str, float]] = {}
    with served(args.repo, stats / "tritonserver.log", stats_dir=stats) as server:
        url = server.endpoints.grpc
        ref = f"{kind}_triton_0us"
        with Client(url) as c:
            t1 = c.median_latency(ref, c.random_inputs(ref, 1, seed=0), 30, sla_ms=60_000)
        print(f"{kind}: t1 {t1 * 1e3:.2f} ms (on {ref})")
        for f in [float(v) for v in args.loads.split(",")]:
            for suffix in args.models.split(","):
                model = f"{kind}_{suffix}"
                procs = processes(server.proc.pid) if args.cpu else {}
                cpu0 = {k: cpu_seconds(p) for k, p in procs.items()}
                r = run_load(url, model, f / t1, args.duration, sla_ms=5 * t1 * 1e3, seed=1, timeout_s=120.0)
                time.sleep(0.5)
                now = triton_counts(server.endpoints.metrics, model)
                before = seen.get(model, {})
                seen[model] = now
                d = {k: v - before.get(k, 0.0) for k, v in now.items()}
                per_exec = d["nv_inference_request_success"] / d["nv_inference_exec_count"] \
                    if d["nv_inference_exec_count"] else float("nan")
                print(f"{f:.0%} {model}: avg {r.avg_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, {r.throughput:.1f}/s; "
                      f"{per_exec:.2f} requests per execute")
                if procs and d["nv_inference_request_success"]:
                    n = d["nv_inference_request_success"]
                    print("   CPU ms per answered request:", ", ".join(
                        f"{k} {(cpu_seconds(p) - cpu0[k]) / n * 1e3:.2f}" for k, p in procs.items()
                        if k in ("tritonserver", model) or cpu_seconds(p) - cpu0[k] > 0.05 * n * 1e-3))
                path = stats / f"{model}.json"
                if path.exists():  # eager and the other scheduler policies write it; whole-graph models do not
                    data = json.loads(path.read_text())
                    print("   since the server started:", json.dumps({k: data.get(k) for k in KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
