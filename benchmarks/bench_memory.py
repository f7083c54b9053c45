"""Memory through a burst: does the server give back what a 5x overload made it take?

    python benchmarks/bench_memory.py                       # the burst test's model and phases, 60 s after
    python benchmarks/bench_memory.py --env MALLOC_ARENA_MAX=2 --param memory_release=false   # a variant

The model is the burst test's (tests/triton/test_ops_server.py): ``make_heavy``, a compute-bound graph whose
intermediate tensors are 2 MiB a sample, under ``lazy`` with ``max_queue_size`` 32 and ``timeout_action REJECT``
(SLA 1 s). Phases: warm-up at 2x capacity (every batch size once), 0.5x for ``--normal`` s, then the baseline is
taken (idle); a burst at 5x capacity for ``--burst`` s; then 0.5x for ``--after`` s. The resident memory of
tritonserver and of each Python backend stub is sampled every second throughout. The figure: memory ``--after`` s
after the burst ended over the baseline (goal: at most 1.10).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import command_line, git_commit, machine_meta, write_json  # noqa: E402

from lazybatch.batcher.latency_table import LatencyTable  # noqa: E402
from lazybatch.client.soak import OpenLoop, process_label, process_rss, process_tree  # noqa: E402
from lazybatch.repo import add_model  # noqa: E402
from lazybatch.serving import TritonServer, free_port  # noqa: E402
from lazybatch.staging import make_heavy  # noqa: E402

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


def build(out: Path, params: dict[str, str]) -> Path:
    onnx_path = make_heavy(out / "heavy.onnx")
    repo = out / "repository"
    add_model(onnx_path, repo, name=MODEL, policy="lazy", sla_ms=1000, max_batch_size=8, max_queue_size=32,
              timeout_action="REJECT", profile_reps=2, execution_provider="cpu", intra_op_threads=1,
              parameters=params, force=True)
    return repo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--normal", type=float, default=6.0, help="seconds at 0.5x before the burst")
    ap.add_argument("--burst", type=float, default=30.0, help="seconds at 5x capacity")
    ap.add_argument("--after", type=float, default=60.0, help="seconds at 0.5x after the burst")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server's environment")
    ap.add_argument("--param", action="append", default=[], help="key=value config.pbtxt parameter of the model")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/memory"))
    args = ap.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    params = dict(kv.split("=", 1) for kv in args.param)
    args.out.mkdir(parents=True, exist_ok=True)
    repo = build(args.out, params)
    table = LatencyTable.load(repo / MODEL / "1" / "latency.json")
    capacity = max(b / table.whole_graph_latency(b) for b in table.batch_sizes)
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=args.out / "tritonserver.log", env={"OMP_NUM_THREADS": "1", **env})
    server.start(timeout=240)
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
            print(f"{name}: {load:g}x capacity ({load * capacity:.1f}/s) for {secs:g} s", flush=True)
            phase = loop.run(name, rate=load * capacity, duration=secs)
            if name != "burst":  # the burst's backlog drains during the first seconds of "after"
                loop.wait_idle(120)
            phases.append(phase)
        sampler.phase = "end"
        end = sampler.sample()
    finally:
        sampler.stop()
        loop.close()
        code = server.stop()
    lost = sum(p.lost for p in phases)
    ratio = end["total"] / base["total"]
    print(f"\ncapacity {capacity:.1f} samples/s; server exit code {code}; lost {lost}")
    labels = sorted(k for k in base if k not in ("t", "phase", "total"))
    print(f"{'t s':>6} {'phase':<9} {'total MiB':>9} " + " ".join(f"{lab[:22]:>22}" for lab in labels))
    for row in sampler.rows[::5] + [end]:
        print(f"{row['t']:>6.0f} {row['phase']:<9} {row['total'] / MiB:>9.1f} "
              + " ".join(f"{row.get(lab, 0) / MiB:>22.1f}" for lab in labels))
    print(f"\nbaseline {base['total'] / MiB:.1f} MiB; {args.after:g} s after the burst {end['total'] / MiB:.1f} MiB: "
          f"ratio {ratio:.3f} (goal <= 1.10)")
    for p in phases:
        print(p.summary())
    path = write_json(args.out / "memory.json", {
        "command": command_line(), "commit": git_commit(), "machine": machine_meta(), "env": env, "params": params,
        "capacity": capacity, "baseline": base, "end": end, "ratio": ratio, "lost": lost,
        "phases": [p.summary() for p in phases], "samples": sampler.rows})
    print(f"wrote {path}")
    try:
        plot(sampler.rows, labels, args.out / "memory.png")
    except ImportError:
        pass
    return 0 if lost == 0 else 1


def plot(rows: list[dict], labels: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    t = [r["t"] for r in rows]
    ax.plot(t, [r["total"] / MiB for r in rows], label="total", lw=2)
    for lab in labels:
        ax.plot(t, [r.get(lab, 0) / MiB for r in rows], label=lab, lw=1)
    for ph in ("burst", "after"):
        ts = [r["t"] for r in rows if r["phase"] == ph]
        if ts:
            ax.axvspan(ts[0], ts[-1], alpha=0.08 if ph == "after" else 0.2, color="C3" if ph == "burst" else "C2")
    ax.set_xlabel("seconds")
    ax.set_ylabel("resident memory (MiB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
