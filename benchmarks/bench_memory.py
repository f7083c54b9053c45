"""Memory through a burst: does the server give back what a 5x overload made it take?

    python -m benchmarks.bench_memory                       # with and without memory release, 3 runs each
    python -m benchmarks.bench_memory --variants release --reps 1 --env MALLOC_ARENA_MAX=2   # one look, other env

The model is the burst test's (tests/triton/test_ops_server.py): ``make_heavy``, a compute-bound graph whose
intermediate tensors are 2 MiB a sample, under ``lazy`` with ``max_queue_size`` 32 and ``timeout_action REJECT``
(SLA 1 s; ``--policy`` for another). Phases: warm-up at 2x capacity (every batch size once), 0.5x for ``--normal`` s, then the baseline is
taken (idle); a burst at 5x capacity for ``--burst`` s; then 0.5x for ``--after`` s. The resident memory of
tritonserver and of each Python backend stub is sampled every second throughout. The figure: memory ``--after`` s
after the burst ended over the baseline (goal: at most 1.10), with the backend's memory release (the default) and
without it (``memory_release_ms: 0``), in turns. And the burst's promises (timeout_action REJECT): the share of
accepted requests that missed the 1 s SLA as the client saw it (goal: at most 1%), and how fast refusals came.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import command_line, git_commit, machine_meta, write_json, start_server
from benchmarks.harness.plots import pyplot, save

from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.client.soak import OpenLoop, process_label, process_rss, process_tree
from lazybatch.repo import add_model
from lazybatch.staging import make_heavy

MODEL = "heavy"
MiB = 2**20


class Sampler:
    """Resident memory of every process of the server, once a second, labelled with the phase it falls in."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        self.pid, self.every = pid, every
        self.phase = "start"
        self.rows: list[dict] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> dict:
        per = {}
        for p in process_tree(self.pid):
            label = process_label(p)
            per[label] = per.get(label, 0) + process_rss(p)
        row = {"t": round(time.monotonic() - self.t0, 2), "phase": self.phase, "total": sum(per.values()), **per}
        self.rows.append(row)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def build(out: Path, params: dict[str, str], policy: str) -> Path:
    onnx_path = make_heavy(out / "heavy.onnx")
    repo = out / "repository"
    add_model(onnx_path, repo, name=MODEL, policy=policy, sla_ms=1000, max_batch_size=8, max_queue_size=32,
              timeout_action="REJECT", profile_reps=2, execution_provider="cpu", intra_op_threads=1,
              parameters=params, force=True)
    return repo


VARIANTS = {"release": {}, "no-release": {"memory_release_ms": "0"}}  # the default, and without memory release


def one_run(out: Path, params: dict[str, str], env: dict[str, str], args: argparse.Namespace) -> dict:
    """One server through warm-up, normal load, the burst and the load after it; memory sampled every second."""
    out.mkdir(parents=True, exist_ok=True)
    repo = build(out, params, args.policy)
    table = LatencyTable.load(repo / MODEL / "1" / "latency.json")
    capacity = max(b / table.whole_graph_latency(b) for b in table.batch_sizes)
    server = start_server(repo, out / "tritonserver.log", env={"OMP_NUM_THREADS": "1", **env}, timeout=240)
    xs = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    loop = OpenLoop(server.endpoints.grpc, MODEL, lambda i: {"x": xs[i % 64:i % 64 + 1]})
    sampler = Sampler(server.proc.pid)
    phases = []
    try:
        for name, load, secs in [("warm-up", 2.0, 2.0), ("normal", 0.5, args.normal), ("burst", 5.0, args.burst),
                                 ("after", 0.5, args.after)]:
            if name == "burst":
                sampler.phase = "baseline"
                time.sleep(1.0)
                base = sampler.sample()
            sampler.phase = name
            phase = loop.run(name, rate=load * capacity, duration=secs)
            if name != "burst":  # the burst's backlog drains during the first seconds of "after"
                loop.wait_idle(120)
            phases.append(phase)
        sampler.phase = "end"
        end = sampler.sample()
    finally:
        sampler.stop()
        loop.close()
        server.stop()
    peak = max(r["total"] for r in sampler.rows if r["phase"] in ("burst", "after"))
    burst = phases[2]
    return {"params": params, "capacity": capacity, "baseline": base, "end": end, "ratio": end["total"] / base["total"],
            "peak_ratio": peak / base["total"], "burst_accepted": burst.count("ok"), "burst_late": burst.late(1.0),
            "burst_rejected_p99_ms": burst.latency_ms(99, "rejected"), "lost": sum(p.lost for p in phases),
            "duplicated": sum(p.duplicated for p in phases), "phases": [p.summary() for p in phases],
            "samples": sampler.rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--normal", type=float, default=6.0, help="seconds at 0.5x before the burst")
    ap.add_argument("--burst", type=float, default=30.0, help="seconds at 5x capacity")
    ap.add_argument("--after", type=float, default=60.0, help="seconds at 0.5x after the burst")
    ap.add_argument("--policy", default="lazy", help="the model's policy (repo add --policy)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each variant (they take turns)")
    ap.add_argument("--variants", default="release,no-release", help=f"from {sorted(VARIANTS)}")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server's environment")
    ap.add_argument("--param", action="append", default=[], help="key=value config.pbtxt parameter of the model")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/memory"))
    ap.add_argument("--json", type=Path, default=None, help="also write the raw data here (docs/data/...)")
    args = ap.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    extra = dict(kv.split("=", 1) for kv in args.param)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    runs: dict[str, list[dict]] = {v: [] for v in names}
    from tqdm import tqdm

    total = args.reps * len(names)
    with tqdm(total=total, desc="memory runs", unit="run") as bar:
        for rep in range(args.reps):
            for v in names:  # the variants take turns, so that a slow spell of the machine hits both
                runs[v].append(one_run(args.out / f"{v}_{rep}", {**VARIANTS[v], **extra}, env, args))
                bar.update(1)
    print(f"\nmemory of tritonserver + stubs {args.after:g} s after a {args.burst:g} s burst at 5x capacity, over "
          f"its level before the burst (goal <= 1.10); {args.reps} repetitions: mean [min-max]")
    for v in names:
        r = [x["ratio"] for x in runs[v]]
        p = [x["peak_ratio"] for x in runs[v]]
        base = [x["baseline"]["total"] / MiB for x in runs[v]]
        print(f"  {v:<11} after/before {spread_text(r)}  peak/before {spread_text(p)}  before {spread_text(base, 0)} "
              f"MiB  lost {sum(x['lost'] for x in runs[v])} duplicated {sum(x['duplicated'] for x in runs[v])}")
        acc = sum(x["burst_accepted"] for x in runs[v])
        late = sum(x["burst_late"] for x in runs[v])
        print(f"  {'':<11} burst: {late} of {acc} accepted requests late ({100 * late / max(acc, 1):.2f}%; goal <= 1%), "
              f"rejections answered in p99 {spread_text([x['burst_rejected_p99_ms'] for x in runs[v]], 1)} ms")
    path = write_json(args.out / "memory.json", {
        "command": command_line(), "commit": git_commit(), "machine": machine_meta(), "env": env, "runs": runs})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, args.json)
    print(f"wrote {path}" + (f" and {args.json}" if args.json else ""))
    try:
        plot(runs, args.out / "memory.png")
    except ImportError:
        pass
    return 0 if all(x["lost"] == 0 and x["duplicated"] == 0 for rs in runs.values() for x in rs) else 1


def spread_text(values: list[float], digits: int = 3) -> str:
    return f"{np.mean(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    """Total memory over time, one line a run, one colour a variant; the burst shaded."""
    plt = pyplot()
    if plt is None:
        print(f"no plot {path}: matplotlib is not installed (pip install -e '.[plots]')")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, (v, rs) in enumerate(runs.items()):
        for j, run in enumerate(rs):
            rows = run["samples"]
            t0 = next(r["t"] for r in rows if r["phase"] == "burst")
            ax.plot([r["t"] - t0 for r in rows], [r["total"] / MiB for r in rows], color=f"C{k}", lw=1,
                    alpha=0.8, label=v if j == 0 else None)
    burst = next(iter(runs.values()))[0]["samples"]
    span = [r["t"] for r in burst if r["phase"] == "burst"]
    if span:
        ax.axvspan(0, span[-1] - span[0], alpha=0.15, color="C3", label="burst (5x capacity)")
    ax.set_xlabel("seconds from the start of the burst")
    ax.set_ylabel("tritonserver + stubs, resident MiB")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
