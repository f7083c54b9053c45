"""The test repository of the real-server tests: small MLP models under every policy (see conftest.py).

The models share one whole graph so that every answer can be checked against onnxruntime on that graph.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


from lazybatch.repo import add_model
from lazybatch.serving import TritonServer
from lazybatch.staging import make_heavy, make_mlp, split_model

# policy name in the test repository -> `lazybatch repo add --policy`
POLICIES = {
    "mlp_eager": "eager",  # the default policy (batcher/policies/eager/)
    "mlp_lazy": "lazy",
    "mlp_oracle": "oracle",
    "mlp_serial": "serial",
    "mlp_graph": "graph:2",
    "mlp_triton0": "triton:0",
    "mlp_triton2000": "triton:2000",
    "mlp_monitor": "monitor",  # BatchMonitor/BatchDispatcher (batcher/policies/monitor.py)
    "mlp_adhoc": "adhoc",
    "mlp_deadline": "deadline",
}
NAN_STRICT = {"mlp_eager", "mlp_lazy", "mlp_triton2000"}  # allow_nan: false (the bad-input tests send NaN); the rest accept NaN/Inf
EXTRA = {"mlp_graph300": "graph:300"}
WIDE = [("wide_eager", "eager", True), ("wide_triton0", "triton:0", True), ("wide_strict", "eager", False)]  # a long batching window: requests wait, so cancellations land
MAX_BATCH = 8
NPU_SCALE = 1000  # mlp_npu: the wall clock runs 1000x slower than the modelled NPU (~0.7 ms per stage)


@dataclass
class Served:
    server: TritonServer
    repo: Path
    stats_dir: Path
    log: Path
    mlp: Path  # the whole graph every mlp_* model serves
    slow: Path  # the whole graph of slow_lazy

    @property
    def grpc(self) -> str:
        return self.server.endpoints.grpc

    @property
    def http(self) -> str:
        return self.server.endpoints.http

    def stats(self, model: str, *, settle: float = 10.0) -> dict:
        """The backend's statistics (written by the scheduler thread whenever it holds nothing), once stable."""
        return settled_stats(self.stats_dir / f"{model}.json", settle)


def settled_stats(path: Path, settle: float = 10.0) -> dict:
    """A backend statistics file (``LAZYBATCH_STATS_DIR/<model>.json``, rewritten at quiet moments) once
    two reads 0.3 s apart agree. Before the model answered anything there is no file: zero counts then."""
    end = time.monotonic() + settle
    last = None
    while time.monotonic() < end:
        data = None
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError:
                data = None
        else:
            data = {"requests": 0, "samples": 0, "answered": {}, "batch_hist": {}}
        if data is not None and data == last:
            return data
        last = data
        time.sleep(0.3)
    raise AssertionError(f"statistics in {path.name} did not settle: {last}")


def crash_at_stop(code: int | None, log: Path) -> str | None:
    """What tritonserver's log says of a crash that came only after SIGINT, during the unload; None where the exit
    was clean or the crash came another way (while serving, or a hang): those fail the caller.

    The 18-model server of conftest.py sometimes aborts at its stop with glibc's heap check
    (``tcache_thread_shutdown(): unaligned tcache chunk detected``): a thread that exits at the unload finds a freed
    chunk written after its free. valgrind's memcheck over the same tests found no invalid read, write or free in
    tritonserver (threads run one at a time there), and each half of the tests alone ran clean 3 times where all of
    them together crashed 2 runs of 3: a race in tritonserver 2.51 whose cause is not found (docs/operations.md,
    Tests). Every request the tests sent was answered as they assert; a crash while serving still fails."""
    if code == 0:
        return None
    text = log.read_text(errors="replace")
    stop = text.find("Signal (2) received.")
    if code not in (-6, -11) or stop < 0 or "Signal (" in text[:stop]:
        return None
    after = text[stop:]
    crash = next((line for line in after.splitlines() if "tcache" in line or "corrupt" in line), None)
    return crash or f"Signal ({-code}) after SIGINT"


def build_repository(root: Path) -> tuple[Path, Path, Path]:
    repo = root / "model_repository"
    mlp = make_mlp(root / "mlp.onnx", in_dim=32, width=128, depth=6, out_dim=10, seed=1)
    # cut after every Relu: the skip connection then crosses stage boundaries ("from" an earlier stage)
    import onnx

    relus = [i for i, n in enumerate(onnx.load(str(mlp)).graph.node) if n.op_type == "Relu"]
    stages = split_model(mlp, root / "mlp_stages", cut_after=relus)
    for name, policy in {**POLICIES, **EXTRA}.items():
        add_model(mlp, repo, name=name, policy=policy, sla_ms=500, max_batch_size=MAX_BATCH, stages=stages,
                  profile_reps=2, execution_provider="cpu", intra_op_threads=1, allow_nan=name not in NAN_STRICT)
    # split by `lazybatch split` itself (repo add without --stages)
    add_model(mlp, repo, name="mlp_split", policy="lazy", sla_ms=500, max_batch_size=MAX_BATCH, max_stages=3,
              profile_reps=2, execution_provider="cpu", intra_op_threads=1)
    slow = make_mlp(root / "slow.onnx", in_dim=256, width=1024, depth=8, out_dim=16, seed=2)
    add_model(slow, repo, name="slow_lazy", policy="lazy", sla_ms=10000, max_batch_size=MAX_BATCH, profile_reps=1,
              execution_provider="cpu", intra_op_threads=1, allow_nan=False)
    # a wide input (4096 floats): perf_analyzer's default random bytes then surely hold NaN/Inf bit patterns
    # (test_standard_tools.py); default models serve them, the strict one refuses them
    wide = make_mlp(root / "wide.onnx", in_dim=4096, width=16, depth=2, out_dim=4, seed=4)
    for name, policy, allow_nan in WIDE:
        add_model(wide, repo, name=name, policy=policy, sla_ms=1000, max_batch_size=MAX_BATCH, profile_reps=1,
                  execution_provider="cpu", intra_op_threads=1, allow_nan=allow_nan)
    from lazybatch.npu_repo import add_npu_model, add_npu_timing

    # the NPU-time executor: outputs from onnxruntime, stages released at the NPU time x 1000 (test_npu_executor.py)
    add_npu_model(mlp, repo, name="mlp_npu", npu_time_scale=NPU_SCALE, policy="lazy", sla_ms=500,
                  max_batch_size=MAX_BATCH, stages=stages, execution_provider="cpu", intra_op_threads=1)
    add_npu_timing(repo)  # NPU latency queries over the models above (test_npu_timing.py)
    return repo, mlp, slow



@dataclass
class ProdModels:
    repo: Path
    mlp: Path
    heavy: Path
    heavy_stages: int


def build_prod_repository(root: Path) -> ProdModels:
    """The production tests' repository (tests/triton/test_ops_server.py), served with explicit model control:
    small MLPs for metrics, faults and unload/reload, and the heavy model under admission control for the burst."""
    import onnx

    from lazybatch.batcher.latency_table import LatencyTable

    repo = root / "prod_repository"
    mlp = make_mlp(root / "mlp.onnx", in_dim=32, width=128, depth=6, out_dim=10, seed=1)
    relus = [i for i, n in enumerate(onnx.load(str(mlp)).graph.node) if n.op_type == "Relu"]
    stages = split_model(mlp, root / "prod_mlp_stages", cut_after=relus)
    common = dict(max_batch_size=MAX_BATCH, stages=stages, profile_reps=2, execution_provider="cpu",
                  intra_op_threads=1)
    fast = {"metrics_interval_ms": "100"}
    add_model(mlp, repo, name="prod_mlp", policy="lazy", sla_ms=2000, parameters=fast, allow_nan=False, **common)
    add_model(mlp, repo, name="prod_monitor", policy="monitor:window_ms=200", sla_ms=2000, parameters=fast, **common)
    add_model(mlp, repo, name="prod_fault", policy="lazy", sla_ms=2000,
              parameters={**fast, "fault_injection": "stage=2,every=5"}, **common)
    heavy = make_heavy(root / "heavy.onnx")
    relus = [i for i, n in enumerate(onnx.load(str(heavy)).graph.node) if n.op_type == "Relu"]
    hstages = split_model(heavy, root / "heavy_stages", cut_after=relus[:-1])
    hcommon = dict(max_batch_size=MAX_BATCH, stages=hstages, execution_provider="cpu", intra_op_threads=1)
    add_model(heavy, repo, name="prod_heavy", policy="lazy", sla_ms=1000, max_queue_size=4 * MAX_BATCH,
              timeout_action="REJECT", profile_reps=2, parameters={"metrics_interval_ms": "200"}, **hcommon)
    table = repo / "prod_heavy" / "1" / "latency.json"
    # the same model without admission control (DELAY): requests queue up, held when it is unloaded
    add_model(heavy, repo, name="prod_heavy_delay", policy="lazy", sla_ms=60000, latency_table=table, **hcommon)
    # request priorities (Triton's names): two levels, requests without one at level 2
    add_model(heavy, repo, name="prod_heavy_prio", policy="serial", sla_ms=60000, latency_table=table,
              parameters={"priority_levels": "2", "default_priority_level": "2"}, **hcommon)
    # mixed traffic (docs/results/mixed.md): eager with two levels and its urgency rule; Triton's own batcher with two levels and
    # a queue timeout per level
    for name, policy in (("prod_heavy_urgency", "eager:urgency=true"),):
        add_model(heavy, repo, name=name, policy=policy, sla_ms=60000, latency_table=table, priority_levels=2,
                  default_priority_level=2, **hcommon)
    add_model(heavy, repo, name="prod_heavy_triton_prio", policy="triton:0", priority_levels=2,
              default_priority_level=2, priority_timeouts_us={1: 2_000_000, 2: 60_000_000}, **hcommon)
    return ProdModels(repo, mlp, heavy, LatencyTable.load(table).graph.n)


def stub_pid(repo: Path, model: str) -> int:
    """The pid of the Python backend stub that serves ``model`` of ``repo`` (its command line names the model's
    model.py), from /proc."""
    want = f"{Path(repo) / model}/".encode()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and any(c.startswith(want) for c in cmd[1:]):
            return int(p)
    raise AssertionError(f"no stub serves {model} of {repo}")

