"""One arrival trace, simulated on the NPU table and served by a real Triton server on NPU time, side by side.

    python -m benchmarks.bench_npu_served                         # MLP 8 x 1024, 3 NPU rates, lazy + graph (~4 min)
    python -m benchmarks.bench_npu_served --rates 2000 --requests 200 --policies lazy   # a quick look
    python -m benchmarks.bench_npu_served --trace my_trace.csv    # arrival_s in NPU time (lazybatch simulate format)

The served deployment is a lazybatch model with ``executor: npu`` (backend/npu_executor.py): onnxruntime computes
the outputs on this CPU, each stage is released at ``k x`` its modelled NPU time, and the scheduler reads the NPU
table x k. The wall clock then runs k times slower than the NPU (``--npu-time-scale``, default 200), so the trace
is replayed with arrival gaps x k, SLAs and batching windows x k, and served latencies are divided by k before they
are set next to the simulator's (which runs the unscaled NPU table on its virtual clock). Requests are sent
open-loop at the trace's times (gRPC async), outputs are checked against onnxruntime on the whole graph.

Printed and written (``--out``): per policy and rate, average / p50 / p99 latency and the mean executed batch size,
simulated and served, their ratio, and the fraction of stage runs where the CPU took longer than k x NPU time
(an overrun: that stage completed late, at the CPU's time). Plot: latency CDFs, simulated solid, served dashed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import command_line, machine_meta, percentile
from benchmarks.harness.plots import pyplot, save
from lazybatch.batcher import LatencyTable, parse_policy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.simulator import workload
from lazybatch.simulator.engine import Simulation


def build(root: Path, policies: list[str], k: float, sla_ms: float, window_ms: float, max_batch: int,
          width: int, depth: int, cancel_poll_ms: float) -> tuple[Path, Path, dict[str, str]]:
    import onnx

    from lazybatch.backend.config_pbtxt import config_to_text, load_config
    from lazybatch.npu_repo import add_npu_model
    from lazybatch.staging import make_mlp, split_model

    mlp = make_mlp(root / "mlp.onnx", in_dim=256, width=width, depth=depth, out_dim=16, seed=3)
    relus = [i for i, n in enumerate(onnx.load(str(mlp)).graph.node) if n.op_type == "Relu"]
    stages = split_model(mlp, root / "stages", cut_after=relus)
    repo = root / "repo"
    names = {}
    for pol in policies:
        served_pol = f"graph:{window_ms * k:g}" if pol == "graph" else pol
        name = f"mlp_{pol}_npu"
        mdir = add_npu_model(mlp, repo, name=name, npu_time_scale=k, policy=served_pol, sla_ms=sla_ms * k,
                             max_batch_size=max_batch, stages=stages, execution_provider="cpu", intra_op_threads=1)
        conf = load_config(mdir / "config.pbtxt")  # each is_cancelled() poll is a round trip to the server process
        conf.parameters["cancel_poll_ms"].string_value = f"{cancel_poll_ms:g}"
        (mdir / "config.pbtxt").write_text(config_to_text(conf))
        names[pol] = name
    return repo, mlp, names


def simulate(table: LatencyTable, pol: str, arrivals, sla_s: float, window_ms: float, max_batch: int) -> dict:
    spec = f"graph:{window_ms:g}" if pol == "graph" else pol
    sim = Simulation(table, parse_policy(spec).build(max_batch_size=max_batch), log=DecisionLog(1, enabled=False))
    reqs = workload.requests(arrivals, sla_s)
    sim.run(reqs)
    lat = [r.latency for r in reqs]
    execs = sum(sim.batch_hist.values())
    return {"lat": lat, "mean_batch": sum(b * c for b, c in sim.batch_hist.items()) / execs}


def serve(url: str, model: str, arrivals, k: float, x_all: np.ndarray, ref: np.ndarray) -> dict:
    """Open-loop replay at the trace's times x k; latencies in NPU time (divided by k)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    lat: list[float | None] = [None] * len(arrivals)
    errors: list[str] = []
    done = threading.Semaphore(0)

    def callback(i: int, sent: float):
        def cb(result, error):
            t = time.perf_counter()
            if error is not None:
                errors.append(str(error))
            else:
                y = result.as_numpy("y")
                if not np.allclose(y, ref[i:i + 1], rtol=1e-4, atol=1e-5):
                    errors.append(f"request {i}: wrong output")
                lat[i] = (t - sent) / k
            done.release()
        return cb

    t0 = time.perf_counter() + 0.2
    for i, a in enumerate(arrivals):
        inp = grpcclient.InferInput("x", [1, x_all.shape[1]], "FP32")
        inp.set_data_from_numpy(x_all[i:i + 1])
        wait = t0 + a.time * k - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        client.async_infer(model, [inp], callback(i, time.perf_counter()))
    for _ in arrivals:
        done.acquire()
    client.close()
    if errors:
        raise RuntimeError(f"{len(errors)} served requests failed, e.g. {errors[0]}")
    return {"lat": [x for x in lat if x is not None]}


def stats(path: Path) -> dict:
    for _ in range(50):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.1)
    return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,4000,8000", help="NPU-time arrival rates, requests/s")
    ap.add_argument("--requests", type=int, default=300, help="requests per rate")
    ap.add_argument("--policies", default="lazy,graph", help="lazy, graph (GraphB with --window-ms), serial, oracle")
    ap.add_argument("--trace", type=Path, help="replay this trace (NPU time) instead of Poisson arrivals")
    ap.add_argument("--npu-time-scale", type=float, default=200.0, help="k: the served wall clock runs k x slower")
    ap.add_argument("--sla-ms", type=float, default=5.0, help="SLA target in NPU time (served: x k)")
    ap.add_argument("--window-ms", type=float, default=1.0, help="GraphB's batching window in NPU time")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cancel-poll-ms", type=float, default=1000.0, help="the served models' cancel_poll_ms (wall "
                    "time; the backend's default 2 ms costs a round trip per held request and stage)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/npu_served"))
    ap.add_argument("--plot", type=Path, default=None, help="plot path (default OUT/npu_served_vs_sim.png)")
    args = ap.parse_args()
    from benchmarks.harness import start_server

    meta = {**machine_meta(), "command": command_line()}  # the commit and machine the figures are from, at the start

    k = args.npu_time_scale
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    rates = [0.0] if args.trace else [float(r) for r in args.rates.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    cdfs: dict[tuple[str, float], tuple[list, list]] = {}
    with tempfile.TemporaryDirectory(prefix="lazybatch-npu-served-") as tmp:
        root = Path(tmp)
        repo, mlp, names = build(root, policies, k, args.sla_ms, args.window_ms, args.max_batch_size, args.width,
                                 args.depth, args.cancel_poll_ms)
        table_k = LatencyTable.load(repo / names[policies[0]] / "1" / "latency.json")  # the unscaled NPU table
        print(f"model: MLP {args.depth} x {args.width} in {table_k.graph.n} stages; NPU batch-1 request "
              f"{sum(table_k.single) * 1e3:.3f} ms; served at npu_time_scale {k:g}")
        import onnxruntime as ort

        sess = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
        stats_dir = root / "stats"
        server = start_server(repo, root / "tritonserver.log", stats_dir=stats_dir, env={"OMP_NUM_THREADS": "1"},
                              timeout=240)
        try:
            for rate in rates:
                arrivals = (workload.load_trace(args.trace) if args.trace else
                            workload.poisson(rate, args.requests, args.seed, graph=table_k.graph))
                rng = np.random.default_rng(args.seed)
                x_all = rng.standard_normal((len(arrivals), 256)).astype(np.float32)
                ref = sess.run(None, {"x": x_all})[0]
                for pol in policies:
                    sim = simulate(table_k, pol, arrivals, args.sla_ms / 1e3, args.window_ms, args.max_batch_size)
                    before = stats(stats_dir / f"{names[pol]}.json") if (stats_dir / f"{names[pol]}.json").exists() \
                        else {}
                    t0 = time.perf_counter()
                    srv = serve(server.endpoints.grpc, names[pol], arrivals, k, x_all, ref)
                    wall = time.perf_counter() - t0
                    time.sleep(0.5)
                    after = stats(stats_dir / f"{names[pol]}.json")
                    hist = {int(b): c - before.get("batch_hist", {}).get(b, 0)
                            for b, c in after.get("batch_hist", {}).items()}
                    execs = sum(hist.values())
                    npu_a, npu_b = after.get("npu", {}), before.get("npu", {})
                    runs = npu_a.get("stage_runs", 0) - npu_b.get("stage_runs", 0)
                    over = npu_a.get("overruns", 0) - npu_b.get("overruns", 0)
                    label = parse_policy(f"graph:{args.window_ms:g}" if pol == "graph" else pol).label
                    row = {"policy": label, "rate": rate, "requests": len(arrivals),
                           "sim_avg_ms": statistics.fmean(sim["lat"]) * 1e3, "sim_p50_ms": percentile(sim["lat"], 50) * 1e3,
                           "sim_p99_ms": percentile(sim["lat"], 99) * 1e3, "sim_mean_batch": sim["mean_batch"],
                           "served_avg_ms": statistics.fmean(srv["lat"]) * 1e3,
                           "served_p50_ms": percentile(srv["lat"], 50) * 1e3, "served_p99_ms": percentile(srv["lat"], 99) * 1e3,
                           "served_mean_batch": sum(b * c for b, c in hist.items()) / execs if execs else float("nan"),
                           "overrun_fraction": over / runs if runs else float("nan"), "served_wall_s": wall,
                           "overhead_per_stage_ms": after.get("overhead_per_stage_ms", float("nan"))}
                    row["avg_ratio"] = row["served_avg_ms"] / row["sim_avg_ms"]
                    rows.append(row)
                    cdfs[(label, rate)] = (sim["lat"], srv["lat"])
                    print(f"  {label:10s} rate {rate:>6g}: avg sim {row['sim_avg_ms']:.3f} / served "
                          f"{row['served_avg_ms']:.3f} ms ({row['avg_ratio']:.2f}x), p99 {row['sim_p99_ms']:.3f} / "
                          f"{row['served_p99_ms']:.3f}, batch {row['sim_mean_batch']:.2f} / "
                          f"{row['served_mean_batch']:.2f}, overruns {row['overrun_fraction']:.1%}, server overhead/stage {row['overhead_per_stage_ms']:.2f} ms wall "
                          f"({wall:.1f} s)",
                          flush=True)
        finally:
            server.stop()
    print("\n| policy | NPU rate (req/s) | avg ms sim / served | p50 ms sim / served | p99 ms sim / served | "
          "served / sim avg | mean batch sim / served | stage overruns |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['rate']:g} | {r['sim_avg_ms']:.3f} / {r['served_avg_ms']:.3f} | "
              f"{r['sim_p50_ms']:.3f} / {r['served_p50_ms']:.3f} | {r['sim_p99_ms']:.3f} / {r['served_p99_ms']:.3f} | "
              f"{r['avg_ratio']:.2f}x | {r['sim_mean_batch']:.2f} / {r['served_mean_batch']:.2f} | "
              f"{r['overrun_fraction']:.1%} |")
    (args.out / "npu_served_vs_sim.json").write_text(json.dumps({"meta": meta, "config": {
        k2: str(v) for k2, v in vars(args).items()}, "rows": rows}, indent=1))
    plot_path = args.plot or args.out / "npu_served_vs_sim.png"
    try:
        plot(cdfs, plot_path, k)
        print(f"wrote {plot_path}")
    except ImportError:
        print("matplotlib not installed (the plots extra): no plot", file=sys.stderr)
    return 0


def plot(cdfs: dict, path: Path, k: float) -> None:
    plt = pyplot()
    if plt is None:
        print(f"no plot {path}: matplotlib is not installed (pip install -e '.[plots]')")
        return
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    rates = sorted({r for _, r in cdfs})
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 3.8), squeeze=False)
    colors = {}
    for ax, rate in zip(axes[0], rates):
        for (label, r), (sim, srv) in sorted(cdfs.items()):
            if r != rate:
                continue
            c = colors.setdefault(label, f"C{len(colors)}")
            for xs, style, what in ((sim, "-", "simulated"), (srv, "--", "served")):
                v = np.sort(np.array(xs) * 1e3)
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, color=c, label=f"{label} {what}")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel("latency, ms of NPU time")
        ax.set_title(f"{rate:g} req/s" if rate else "trace")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("CDF")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"Simulated (NPU table) vs served (Triton, executor npu, k={k:g}, latencies / k)")
    fig.tight_layout()
    save(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
