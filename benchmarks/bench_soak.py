"""Soak run: steady open-loop load on a real tritonserver, counting lost responses and watching memory.

    python -m benchmarks.bench_soak                        # 5 minutes at 80% of the batch-1 service rate
    python -m benchmarks.bench_soak --duration 60          # a shorter look
    python -m benchmarks.bench_soak --timeout-action REJECT --max-queue-size 64
    python -m benchmarks.bench_soak --from-json docs/data/soak_1800s.json --plot docs/img/soak_1800s.png  # re-plot

One model: an 8-layer MLP of width 1024 cut after every Relu (``lazybatch.staging.make_mlp``, the regime where
batching pays), served by the lazybatch backend under ``--policy`` (lazy). The batch-1 service rate mu is measured
first (median of sequential requests); then Poisson load at ``--load`` x mu for ``--duration`` seconds. Every
request is accounted for (client/soak.py): a request with no answer is *lost*, one with two is *duplicated*; both
must be 0. The resident memory of tritonserver and its Python backend stubs is sampled every ``--rss-every``
seconds: growth from the first sample (after warm-up) to the last, and the slope over the second half (a leak keeps
growing; allocator warm-up levels off). The server's own metrics (lazybatch_requests_total) are checked against the
client's counts. Exit code 1 if anything was lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import command_line, git_commit, machine_meta, start_server
from benchmarks.harness.plots import pyplot, save

from lazybatch.client.api import Client
from lazybatch.client.soak import OpenLoop, metric_total, process_tree_rss, scrape, wait_for
from lazybatch.repo import add_model
from lazybatch.staging import make_mlp, split_model

MODEL = "soak_mlp"


def build(out: Path, args: argparse.Namespace) -> Path:
    """The soak repository (rebuilt every run: the admission flags are in its config)."""
    import onnx

    work = out / "build"
    onnx_path = work / "mlp.onnx"
    if not onnx_path.exists():
        make_mlp(onnx_path, in_dim=256, width=1024, depth=8, out_dim=16, seed=0)
    stages = work / "stages"
    if not (stages / "manifest.json").exists():
        relus = [i for i, n in enumerate(onnx.load(str(onnx_path)).graph.node) if n.op_type == "Relu"]
        split_model(onnx_path, stages, cut_after=relus)
    repo = out / "repository"
    add_model(onnx_path, repo, name=MODEL, policy=args.policy, sla_ms=args.sla_ms, max_batch_size=16, stages=stages,
              profile_reps=3, execution_provider="cpu", intra_op_threads=1, max_queue_size=args.max_queue_size,
              timeout_action=args.timeout_action, parameters={"metrics_interval_ms": "200"}, force=True)
    return repo


def largest_batch(text: str) -> int:
    """The largest sub-batch stage 0 has run: the smallest bucket bound holding every observation."""
    from lazybatch.formats.prometheus import parse_samples

    rows = [(lab["le"], v) for lab, v in parse_samples(text, "lazybatch_stage_batch_size_bucket")
            if lab.get("model") == MODEL and lab.get("stage") == "stage_000"]
    total = max((v for le, v in rows if le == "+Inf"), default=0)
    bounds = sorted(int(float(le)) for le, v in rows if le != "+Inf" and v >= total > 0)
    return bounds[0] if bounds else 0


def plot(result: dict, path: Path) -> Path | None:
    """Memory of tritonserver + stubs and the samples held, over the run (matplotlib; None where it is missing)."""
    plt = pyplot()
    if plt is None:
        return None
    t = [p[0] / 60 for p in result["rss_samples"]]
    mem = [p[1] / 2**20 for p in result["rss_samples"]]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(t, mem, color="tab:blue", lw=1.2, label="tritonserver + stubs (MiB)")
    ax.set_xlabel("minutes of load")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(0, max(mem) * 1.25)
    held = result.get("held_at_samples") or []
    if held:
        ax2 = ax.twinx()
        ax2.plot(t[:len(held)], held, color="tab:orange", lw=0.6, alpha=0.7, label="samples held")
        ax2.set_ylabel("samples held", color="tab:orange")
    ax.set_title(f"soak: {result['sent']:,} requests at {result['load']:.0%} load, lost {result['lost']}, "
                 f"duplicated {result['duplicated']}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=110)
    return path


def service_rate(url: str, n: int = 60) -> float:
    x = {"x": np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)}
    with Client(url) as c:
        return 1.0 / c.median_latency(MODEL, x, n, warmup=5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    ap.add_argument("--load", type=float, default=0.8, help="offered load as a fraction of the batch-1 rate (0.8)")
    ap.add_argument("--policy", default="lazy")
    ap.add_argument("--sla-ms", type=float, default=50.0)
    ap.add_argument("--max-queue-size", type=int, default=0)
    ap.add_argument("--timeout-action", default=None, choices=("REJECT", "DELAY"))
    ap.add_argument("--rss-every", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/soak"))
    ap.add_argument("--from-json", type=Path, help="no run: plot a soak.json written before (see --plot)")
    ap.add_argument("--plot", type=Path, help="where the memory plot goes (default: soak.png beside soak.json)")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw data here (docs/data/...)")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        got = plot(json.loads(args.from_json.read_text()), args.plot or args.from_json.with_suffix(".png"))
        print(f"written: {got}" if got else "matplotlib is missing: pip install 'lazybatch[plots]'")
        return 0 if got else 1
    if args.duration <= 0 or not 0 < args.load <= 5:
        ap.error("--duration must be positive and --load in (0, 5]")
    args.out.mkdir(parents=True, exist_ok=True)
    repo = build(args.out, args)
    log = args.out / "tritonserver.log"
    server = start_server(repo, log, env={"OMP_NUM_THREADS": "1"}, timeout=240)
    try:
        url = server.endpoints.grpc
        mu = service_rate(url)
        rate = args.load * mu
        x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
        loop = OpenLoop(url, MODEL, lambda i: {"x": x[i % 64:i % 64 + 1]}, seed=1)
        with Client(url) as c:  # the largest sub-batch once: onnxruntime's arena grows to it before the baseline
            for _ in range(3):
                c.infer(MODEL, {"x": np.repeat(x[:1], 16, axis=0)})
        warm = loop.run("warm-up", rate=rate, duration=min(10.0, args.duration / 5))
        loop.wait_idle(60)
        time.sleep(1.0)  # the warm-up's counts reach Triton (pushed every 200 ms) before the baseline scrape
        before = scrape(server.endpoints.metrics)
        rss: list[tuple[float, int]] = []
        largest: list[int] = []  # the largest sub-batch the first stage has run so far, at each memory sample
        held: list[float] = []  # samples the scheduler held (lazybatch_queue_samples), at each memory sample
        stop = threading.Event()
        t_start = time.monotonic()

        def sampler() -> None:
            while True:
                rss.append((time.monotonic() - t_start, process_tree_rss(server.proc.pid)))
                try:
                    text = scrape(server.endpoints.metrics)
                    largest.append(largest_batch(text))
                    held.append(metric_total(text, "lazybatch_queue_samples", model=MODEL))
                except OSError:
                    largest.append(-1)
                    held.append(-1)
                if stop.wait(args.rss_every):
                    return

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        bar = None
        try:
            from tqdm import tqdm

            bar = tqdm(total=int(args.duration), unit="s", desc=f"soak at {rate:.0f}/s", file=sys.stderr)
        except ImportError:
            pass
        shown = [0]

        def progress(elapsed: float) -> None:
            if bar is not None and int(elapsed) > shown[0]:
                bar.update(int(elapsed) - shown[0])
                shown[0] = int(elapsed)

        phase = loop.run("soak", rate=rate, duration=args.duration, progress=progress)
        if bar is not None:
            bar.close()
        idle = loop.wait_idle(120)
        stop.set()
        th.join()
        rss.append((time.monotonic() - t_start, process_tree_rss(server.proc.pid)))
        loop.close()
        s = phase.summary()
        ok = s["ok"]
        wait_for(lambda: metric_total(scrape(server.endpoints.metrics), "lazybatch_requests_total", model=MODEL,
                                      outcome="ok") - metric_total(before, "lazybatch_requests_total", model=MODEL,
                                                                   outcome="ok") >= ok, 10)
        text = scrape(server.endpoints.metrics)
        server_ok = metric_total(text, "lazybatch_requests_total", model=MODEL, outcome="ok") - \
            metric_total(before, "lazybatch_requests_total", model=MODEL, outcome="ok")
        server_rej = metric_total(text, "lazybatch_requests_total", model=MODEL, outcome="rejected") - \
            metric_total(before, "lazybatch_requests_total", model=MODEL, outcome="rejected")
    finally:
        code = server.stop()
    half = [p for p in rss if p[0] >= rss[-1][0] / 2]
    slope = float(np.polyfit([p[0] for p in half], [p[1] for p in half], 1)[0]) if len(half) >= 3 else float("nan")
    r0, r1, rmax = rss[0][1], rss[-1][1], max(v for _, v in rss)
    result = {
        **s, "duration_s": args.duration, "load": args.load, "service_rate": mu, "offered_rate": rate,
        "answered_rate": (ok + s["rejected"]) / args.duration, "all_answered": idle,
        "server_ok": server_ok, "server_rejected": server_rej, "server_exit_code": code,
        "rss_start_mb": r0 / 2**20, "rss_end_mb": r1 / 2**20, "rss_max_mb": rmax / 2**20,
        "rss_growth_mb": (r1 - r0) / 2**20, "rss_growth_ratio": r1 / r0,
        "rss_slope_second_half_mb_per_min": slope * 60 / 2**20, "rss_samples": rss,
        "largest_batch_at_samples": largest, "held_at_samples": held,
        "warm_up": warm.summary(), "policy": args.policy, "sla_ms": args.sla_ms,
        "max_queue_size": args.max_queue_size, "timeout_action": args.timeout_action or "DELAY",
        "commit": git_commit(), "command": command_line(), "machine": machine_meta(),
    }
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    png = plot(result, args.plot or args.out / "soak.png")
    print(f"\nbatch-1 service rate {mu:.1f}/s; offered {rate:.1f}/s ({args.load:.0%}) for {args.duration:.0f} s")
    print(f"sent {s['sent']}, ok {ok}, rejected {s['rejected']}, errors {s['error'] + s['other']}, "
          f"lost {s['lost']}, duplicated {s['duplicated']}; server counted ok {server_ok:.0f}, rejected "
          f"{server_rej:.0f}")
    print(f"answered/offered: {result['answered_rate'] / rate:.3f}; latency p50 {s['p50_ms']:.1f} ms, "
          f"p99 {s['p99_ms']:.1f} ms")
    print(f"memory (tritonserver + stubs): {r0 / 2**20:.1f} MB -> {r1 / 2**20:.1f} MB (x{r1 / r0:.3f}, max "
          f"{rmax / 2**20:.1f}); second-half slope {result['rss_slope_second_half_mb_per_min']:+.2f} MB/min")
    print(f"written: {args.out / 'soak.json'}" + (f", {png}" if png else ""))
    return 0 if s["lost"] == 0 and s["duplicated"] == 0 and idle else 1


if __name__ == "__main__":
    sys.exit(main())
