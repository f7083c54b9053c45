"""What eager's ``execute`` costs besides the pass, in-process: a diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_execute_cost --model mobilenet --calls 800 --group 4 --gap-ms 0 \
        --json docs/data/execute_cost_mobilenet.json

Under load a small cost per pass in eager's ``execute`` is magnified by queueing (docs/results/default.md). This
probe loads Triton 0 ms's and eager's models of one repository in this process (``TritonPythonModel`` with a minimal
stand-in for Triton's pb_utils, metrics on as by default) and calls their ``execute`` with the same groups, taking
turns call by call, so that the difference is eager's own work on the same graph: the request parameters, the
policy's decision, the statistics, the scheduler thread's share of the GIL. ``--gap-ms 0``: back to back, as under
saturation. Per model: the median, mean, p90 and p99 wall time of an ``execute`` call; then, over as many calls
again under cProfile, the time per call besides onnxruntime's run (``--profile N``: the top N functions).
No gRPC, no stub IPC: what a served stub adds beside them is not measured here.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]

import numpy as np
from benchmarks.harness import command_line, machine_meta, percentile, write_json

import lazybatch.backend.model as model_mod
from lazybatch import shipped as repo_mod


class _Tensor:
    def __init__(self, name: str, arr: np.ndarray) -> None:
        self._name, self._arr = name, arr

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._arr

    def is_cpu(self) -> bool:  # Triton's input tensors say where they live (backend/input_tensors.py)
        return True


class _Error(Exception):
    INVALID_ARG, INTERNAL, CANCELLED, UNAVAILABLE = "INVALID_ARG", "INTERNAL", "CANCELLED", "UNAVAILABLE"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class _Response:
    def __init__(self, output_tensors: list, error: _Error | None = None) -> None:
        self.outputs = output_tensors
        self.error = error


class _Sender:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, resp: object = None, flags: int = 0) -> None:
        self.sent.append(resp)


class _Request:
    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self._inputs = [_Tensor(k, v) for k, v in inputs.items()]
        self._sender = _Sender()

    def inputs(self) -> list:
        return self._inputs

    def parameters(self) -> str:
        return "{}"

    def get_response_sender(self) -> _Sender:
        return self._sender

    def is_cancelled(self) -> bool:
        return False

    def request_id(self) -> str:
        return ""


class _Metric:
    def __init__(self, labels: dict) -> None:
        self.value = 0.0

    def set(self, v: float) -> None:
        self.value = v

    def increment(self, v: float) -> None:
        self.value += v


class _MetricFamily:
    COUNTER, GAUGE = "COUNTER", "GAUGE"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict) -> _Metric:  # noqa: N802 (pb_utils' name)
        return _Metric(labels)


PB_UTILS = SimpleNamespace(Tensor=_Tensor, TritonError=_Error, InferenceResponse=_Response,
                           MetricFamily=_MetricFamily, TRITONSERVER_RESPONSE_COMPLETE_FINAL=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mlp", choices=[k for k in repo_mod.SHIPPED_MODELS
                                                       if k not in repo_mod.SEQ2SEQ_KINDS])
    ap.add_argument("--calls", type=int, default=400, help="execute calls per model (and as many profiled)")
    ap.add_argument("--group", type=int, default=1, help="requests per execute call")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="idle time between calls")
    ap.add_argument("--profile", type=int, default=0, help="print the profile's top N functions per model")
    ap.add_argument("--out", default="lazybatch-results/execute-cost")
    ap.add_argument("--json", default=None, help="also write the figures here (raw data for the docs)")
    args = ap.parse_args(argv)
    from tests.backendhelpers import initialize_model

    model_mod.pb_utils = PB_UTILS
    out = Path(args.out)
    repo = repo_mod.build_default_repository(out / "repos" / args.model, kind=args.model,
                                             work=out / "build" / args.model,
                                             policies={"triton_0us": "triton:0", "eager": "eager"}, profile_reps=5)
    models = {n: initialize_model(repo / f"{args.model}_{n}") for n in ("triton_0us", "eager")}
    eager = models["eager"]
    spec = eager.settings.inputs
    rng = np.random.default_rng(0)

    def group() -> list[_Request]:
        return [_Request({t.name: rng.standard_normal((1, *[d if d > 0 else 1 for d in t.dims])).astype(t.dtype)
                          for t in spec}) for _ in range(args.group)]

    times: dict[str, list[float]] = {n: [] for n in models}
    for k in range(args.calls):
        reqs = group()
        for n in (models if k % 2 == 0 else reversed(list(models))):
            time.sleep(args.gap_ms / 1e3)
            t0 = time.perf_counter()
            models[n].execute(reqs)
            times[n].append(time.perf_counter() - t0)
    base = statistics.median(times["triton_0us"])
    summary: dict[str, dict] = {}
    for n, ts in times.items():
        med, mean = statistics.median(ts), statistics.fmean(ts)
        q = {90: percentile(ts, 90), 99: percentile(ts, 99)}
        print(f"{n:12s} execute median {med * 1e6:8.1f} us ({(med - base) * 1e6:+.1f} us, "
              f"{(med - base) / base:+.1%} of Triton's); mean {mean * 1e6:8.1f} us, p90 {q[90] * 1e6:8.1f} us, "
              f"p99 {q[99] * 1e6:8.1f} us")
        summary[n] = {"median_us": med * 1e6, "mean_us": mean * 1e6, "p90_us": q[90] * 1e6, "p99_us": q[99] * 1e6}
    print("inline refused:", eager.runtime.stats.inline_refused, "inline groups:", eager.runtime.stats.inline_groups)
    profs = {n: cProfile.Profile() for n in models}
    for k in range(args.calls):
        reqs = group()
        for n in (models if k % 2 == 0 else reversed(list(models))):
            time.sleep(args.gap_ms / 1e3)
            profs[n].enable()
            models[n].execute(reqs)
            profs[n].disable()
    for n, prof in profs.items():
        st = pstats.Stats(prof)
        run = sum(v[3] for f, v in st.stats.items() if "onnxruntime_pybind11_state.run" in f[2])
        total = sum(v[3] for f, v in st.stats.items() if f[2] == "execute")
        summary[n]["profiled_besides_ort_us"] = (total - run) / args.calls * 1e6
        print(f"{n}: execute besides onnxruntime's run, profiled: {(total - run) / args.calls * 1e6:.1f} us a call")
        if args.profile:
            st.sort_stats("tottime").print_stats(args.profile)
    for m in models.values():
        m.finalize()
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line()}, "model": args.model,
                               "calls": args.calls, "group": args.group, "gap_ms": args.gap_ms, "models": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
