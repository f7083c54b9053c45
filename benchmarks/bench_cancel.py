"""How soon a client's cancellation is answered, and how soon its compute stops, on a real tritonserver.

    python -m benchmarks.bench_cancel                        # 40 trials per variant: fixed 50 ms poll vs auto
    python -m benchmarks.bench_cancel --trials 10 --variants fixed50

The model is ``make_heavy`` made deeper (24 MatMul+Relu layers, a stage each: several ms a stage on one core),
served under ``serial`` with ``fuse_stages: false`` so that one request runs at a time, stage by stage, and the
next one waits in the scheduler's queue. A trial sends request A (it runs) and request B (it queues behind A),
cancels B a few stages into A's pass, then cancels A a stage or two later. Measured per cancel, from the client's
``cancel()`` (wall clock, same machine):

- answer: when the backend sent the CANCELLED response (``<model>.cancels.csv``; the client's own callback fires at
  once, locally, so only the server side says when the request was let go);
- stop (A only): when A's last stage ended (the batch log's last line of the trial): compute spent after the
  cancel, and how many stages began after it.

The variants are two models in the same server, taking turns trial by trial, so that a slow spell of the machine
hits both: ``fixed50`` (``cancel_poll_ms: 50``, the earlier fixed rule) and ``auto`` (the default: paced by the
model's stage time, backend/cancel_watch.py). Printed: median and p99 of each figure, and auto over fixed50.
"""

from __future__ import annotations

import argparse
import shutil
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import command_line, git_commit, machine_meta, percentile, start_server, write_json

from lazybatch.backend.stats_logs import read_log
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.repo import add_model
from lazybatch.staging import make_heavy, split_model

DIM = 512
VARIANTS = {"fixed50": {"cancel_poll_ms": "50"}, "auto": {}}


def build(out: Path, names: list[str], depth: int, rows: int) -> Path:
    """One heavy model per variant (same stages, same latency table), cut after every layer."""
    import onnx

    onnx_path = make_heavy(out / "heavy.onnx", rows=rows, dim=DIM, depth=depth)
    relus = [i for i, n in enumerate(onnx.load(str(onnx_path)).graph.node) if n.op_type == "Relu"]
    stages = split_model(onnx_path, out / "stages", cut_after=relus[:-1])
    repo = out / "repository"
    table = None
    for v in names:
        add_model(onnx_path, repo, name=f"cancel_{v}", policy="serial", sla_ms=60000, max_batch_size=4,
                  stages=stages, latency_table=table, profile_reps=2, execution_provider="cpu", intra_op_threads=1,
                  parameters={"fuse_stages": "false", **VARIANTS[v]}, force=True)
        table = table or repo / f"cancel_{v}" / "1" / "latency.json"
    return repo


def trial(client, model: str, stats: Path, tag: str, stage_s: float, n_stages: int, x: np.ndarray) -> dict:
    """A runs, B queues; B is cancelled a few stages into A's pass, A a stage or two later."""
    import tritonclient.grpc as grpcclient

    def inp():
        t = grpcclient.InferInput("x", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        return [t]

    got: dict[str, tuple] = {}
    done = threading.Semaphore(0)

    def cb(name):
        def f(result, error):
            got[name] = (result, error, time.time())
            done.release()
        return f

    sent = time.time()
    a = client.async_infer(model, inp(), cb("A"), request_id=f"{tag}-A")
    b = client.async_infer(model, inp(), cb("B"), request_id=f"{tag}-B")
    time.sleep(random.uniform(2.0, 5.0) * stage_s)
    t_b = time.time()
    b.cancel()
    time.sleep(random.uniform(1.0, 3.0) * stage_s)
    t_a = time.time()
    a.cancel()
    for _ in range(2):
        done.acquire(timeout=30)
    # the server's side: both CANCELLED answers logged (A's pass would end well within a second otherwise)
    end = time.monotonic() + 5.0
    answered: dict[str, float] = {}
    while time.monotonic() < end:
        answered = {rid: float(t) for t, rid in read_log(stats / f"{model}.cancels.csv") if rid.startswith(tag)}
        if len(answered) == 2:
            break
        time.sleep(0.02)
    time.sleep(0.05)  # A's last stage line is written as that stage ends, before its answer
    lines = [(float(r[0]), int(r[1]), float(r[3])) for r in read_log(stats / f"{model}.batches.csv")
             if float(r[0]) >= sent]
    lines.sort()
    a_lines = []  # serial: A's stages come first, 0, 1, 2, ...; B's, if it ran, start again at 0
    for line in lines:
        if line[1] != len(a_lines):
            break
        a_lines.append(line)
    a_end = a_lines[-1][0] if a_lines else sent
    row: dict = {"tag": tag, "t_cancel_a": t_a, "t_cancel_b": t_b, "a_stages": len(a_lines)}
    # a loaded client may sleep past A's whole pass: a cancel that came after A ended measures nothing
    row["a_done_before_cancel"] = len(a_lines) == n_stages and a_end <= t_a
    if f"{tag}-B" in answered and a_end > t_b:  # B still queued behind A at its cancel
        row["answer_queued_ms"] = (answered[f"{tag}-B"] - t_b) * 1e3
    if f"{tag}-A" in answered:
        row["answer_running_ms"] = (answered[f"{tag}-A"] - t_a) * 1e3
        row["stop_running_ms"] = (a_end - t_a) * 1e3
        # stages of A that began after the cancel (the one in progress at the cancel is not counted)
        row["stages_after_cancel"] = sum(1 for t, _, ort in a_lines if t - ort > t_a)
    elif not row["a_done_before_cancel"]:
        row["not_stopped"] = True  # A ran to its end although cancelled during its pass
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=40, help="trials per variant (they take turns)")
    ap.add_argument("--variants", default="fixed50,auto", help=f"from {sorted(VARIANTS)}")
    ap.add_argument("--depth", type=int, default=24, help="layers (stages) of the heavy model")
    ap.add_argument("--rows", type=int, default=1024, help="rows of the heavy model: sets the stage time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/cancel"))
    ap.add_argument("--json", type=Path, default=None, help="also write the raw data here (docs/data/...)")
    args = ap.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    random.seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    repo = build(args.out, names, args.depth, args.rows)
    table = LatencyTable.load(repo / f"cancel_{names[0]}" / "1" / "latency.json")
    stage_s = statistics.median(table.dense[s][1] for s in range(table.graph.n))
    stats = args.out / "stats"
    for f in stats.glob("*.csv"):
        f.unlink()
    meta = machine_meta()
    server = start_server(repo, args.out / "tritonserver.log", stats_dir=stats, env={"OMP_NUM_THREADS": "1"},
                          timeout=240)
    import tritonclient.grpc as grpcclient

    rows: dict[str, list[dict]] = {v: [] for v in names}
    x = np.random.default_rng(0).standard_normal((1, DIM)).astype(np.float32)
    try:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc)
        for v in names:  # warm-up: one whole pass each
            client.infer(f"cancel_{v}", [_input(x)])
        for i in range(args.trials):
            for v in names:
                rows[v].append(trial(client, f"cancel_{v}", stats, f"{v}-{i}", stage_s, table.graph.n, x))
                time.sleep(0.05)
        time.sleep(0.5)  # the statistics file is written at an idle moment
        checks = {v: _stats(stats / f"cancel_{v}.json").get("cancel_checks") for v in names}
    finally:
        server.stop()
    print(f"\ncancellation on a real tritonserver: {args.trials} trials per variant, taking turns; heavy model, "
          f"{table.graph.n} stages, median batch-1 stage time {stage_s * 1e3:.2f} ms (latency table)")
    summary: dict[str, dict] = {}
    for v in names:
        s: dict = {"is_cancelled_calls": checks[v]}
        for key in ("answer_queued_ms", "answer_running_ms", "stop_running_ms", "stages_after_cancel"):
            vals = [r[key] for r in rows[v] if key in r]
            s[key] = {"median": statistics.median(vals), "p99": percentile(vals, 99), "n": len(vals)} if vals else None
        s["not_stopped"] = sum(1 for r in rows[v] if r.get("not_stopped"))
        s["client_late"] = sum(1 for r in rows[v] if r["a_done_before_cancel"])
        summary[v] = s
        print(f"  {v:<8} " + "  ".join(
            f"{k.replace('_ms', '')} median {s[k]['median']:.1f} p99 {s[k]['p99']:.1f}" + (" ms" if k.endswith("ms") else "")
            for k in ("answer_queued_ms", "answer_running_ms", "stop_running_ms", "stages_after_cancel")
            if s[k]) + f"  is_cancelled calls {checks[v]}  not stopped {s['not_stopped']}"
            f"  (trials whose cancel came after A's end: {s['client_late']})")
    if "fixed50" in summary and "auto" in summary:
        print("  auto / fixed50: " + "  ".join(
            f"{k.replace('_ms', '')} median {summary['auto'][k]['median'] / summary['fixed50'][k]['median']:.2f}x "
            f"p99 {summary['auto'][k]['p99'] / summary['fixed50'][k]['p99']:.2f}x"
            for k in ("answer_queued_ms", "answer_running_ms", "stop_running_ms")
            if summary["auto"][k] and summary["fixed50"][k]))
    path = write_json(args.out / "cancel.json", {
        "command": command_line(), "commit": git_commit(), "machine": meta, "stage_ms": stage_s * 1e3,
        "stages": table.graph.n, "summary": summary, "trials": rows})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, args.json)
    print(f"wrote {path}" + (f" and {args.json}" if args.json else ""))
    return 0


def _input(x: np.ndarray):
    import tritonclient.grpc as grpcclient

    t = grpcclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return t


def _stats(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    sys.exit(main())
