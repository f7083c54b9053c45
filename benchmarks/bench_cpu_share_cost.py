"""What the CPU share costs on the request path and beside it: the goal is at most 2% of the small model's t1 per
request (docs/colocation.md, "The CPU through the operating system").

    python -m benchmarks.bench_cpu_share_cost                      # 3 x 10 s; prints the page
    python -m benchmarks.bench_cpu_share_cost --data docs/data/cpu_share_cost.json --page docs/results/cpu_share_cost.md

Two members of one share in processes of their own, as two stubs of one server are: the quickstart's pair, the
small model (SLA 10 ms) with Poisson requests at 30% of its batch-1 rate, and the large one (SLA 100 ms) at
``--large-rate`` with ``--large-threads`` idle threads (a ResNet-50 stub with pools per session has about 30), so
that the large one stays lowered while the small one has requests. Each member counts what the share spends: its
watcher's looks (CPU time of the watcher thread, ``time.thread_time``, around each look), the weight syscalls they
made (setpriority, sched_setscheduler), ``note_active`` on every request (timed around the call), and the parked
pool (backend/pool_park.py): ``--pool-workers`` idle threads unparked before and parked after every request once
its watcher has seen the other member active (a pool parks only beside an active neighbour), as a model whose every
request is a busy period of its own is (timed around the syscalls). The figure:
both members' share CPU time over both members' requests, against the small model's t1 measured in the same run
(the median of 200 batch-1 runs of its whole graph on onnxruntime, in this process, before the members start).
Needs CAP_SYS_NICE (root), or nothing is lowered and the figure would leave out the lowered looks.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

GOAL = 0.02  # at most 2% of the small model's t1 per request


def member(folder: str, name: str, sla_ms: float, rate: float, idle_threads: int, seconds: float, seed: int,
           out: "mp.Queue", pool_workers: int = 1) -> None:
    """One member: ``idle_threads`` idle threads (a pool's workers), Poisson requests at ``rate`` for ``seconds``."""
    from lazybatch.backend.cpu_share import CpuShare
    from lazybatch.backend.pool_park import PoolPark
    from lazybatch.batcher.cpu_rank import ShareMember

    class TimedShare(CpuShare):
        def __init__(self, *args, **kwargs) -> None:
            self.looks, self.look_cpu_s, self.nices, self.each = 0, 0.0, set(), []  # before the watcher starts
            super().__init__(*args, **kwargs)

        def step(self, now: float | None = None) -> int:
            t0 = time.thread_time()
            nice = super().step(now)
            self.each.append(time.thread_time() - t0)
            self.look_cpu_s += self.each[-1]
            self.looks += 1
            self.nices.add(nice)
            return nice

    stop = threading.Event()
    for _ in range(idle_threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    workers: list[int] = []
    for _ in range(pool_workers):
        threading.Thread(target=lambda: (workers.append(threading.get_native_id()), stop.wait()), daemon=True).start()
    while len(workers) < pool_workers:
        time.sleep(0.001)
    park = PoolPark(workers)
    share = TimedShare(ShareMember(name, sla_ms), folder=Path(folder), log=lambda text: None, park=park)
    rng = random.Random(seed)
    requests, parked, note_ns, notes = 0, 0, 0, []
    end = time.monotonic() + seconds
    while True:
        time.sleep(rng.expovariate(rate))
        if time.monotonic() >= end:
            break
        t0 = time.perf_counter_ns()
        share.note_active()
        notes.append(time.perf_counter_ns() - t0)
        note_ns += notes[-1]
        park.unpark()  # the request runs, then the model holds nothing again
        park.park()
        requests += 1
        parked += park.parked
    share.close()
    stop.set()
    out.put({"name": name, "requests": requests, "note_active_s": note_ns / 1e9, "looks": share.looks,
             "look_cpu_s": share.look_cpu_s, "syscalls": share.weights.changes, "refused": share.weights.refused,
             "park_syscalls": park.syscalls, "park_s": park.syscall_s, "pool_workers": pool_workers,
             "parked_requests": parked, "parks": park.parks,
             "lowered_s": share.lowered_seconds(), "nices": sorted(share.nices), "threads": idle_threads,
             "look_cpu_us": [round(v * 1e6, 1) for v in share.each], "note_ns": notes})


def small_t1(repository: Path, n: int = 200) -> float:
    """Median seconds of ``n`` batch-1 runs of the small model's whole graph (after 20 untimed)."""
    import numpy as np
    import onnxruntime as ort

    from lazybatch.shipped import PAIR_KINDS, PAIR_OURS

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(repository / f"{PAIR_KINDS['small']}_{PAIR_OURS}" / "1" / "model.onnx"), so,
                                providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
             .astype(np.float32) for i in sess.get_inputs()}
    times = []
    for k in range(20 + n):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        if k >= 20:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def one_rep(seconds: float, rates: dict[str, float], threads: dict[str, int], seed: int,
            pool_workers: int = 1) -> list[dict]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    slas = {"small": 10.0, "large": 100.0}
    with tempfile.TemporaryDirectory(prefix="cpu-share-cost-") as folder:
        procs = [ctx.Process(target=member, args=(folder, role, slas[role], rates[role], threads[role], seconds,
                                                  seed * 2 + i, out, pool_workers))
                 for i, role in enumerate(("small", "large"))]
        for p in procs:
            p.start()
        rows = [out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join(30)
    return sorted(rows, key=lambda r: r["name"] != "small")


def markdown(data: dict) -> str:
    from benchmarks.harness import fmt, judge_spread, spread

    m = data["meta"]
    lines = [f"# What the CPU share costs\n\nGenerated by `{m['command']}` at commit {m.get('commit', '?')}; raw data "
             f"in {m['data']}; design in [colocation.md](../colocation.md#the-cpu-through-the-operating-system).\n",
             f"Two members of one share in processes of their own: the small model at {m['rates']['small']:.1f} "
             f"requests/s (30% of its batch-1 rate, t1 {m['t1_ms']:.3f} ms measured in this run), the large one at "
             f"{m['rates']['large']:.1f}/s with {m['threads']['large']} idle threads, lowered while the small one "
             f"has requests; {m['reps']} repetitions of {m['seconds']:g} s. Per request: both members' share CPU "
             "time (watcher looks, CPU time of the watcher thread, note_active, and parking its pool's "
             f"{m.get('pool_workers', 0)} workers before and after every request, as a model whose every request "
             "is a busy period of its own does) over both members' requests; "
             "mean [min-max] over the repetitions. note_active is timed in wall time around each call, right after "
             "the member's sleep between requests (its caches cold), so its figure is an upper bound; t1 is the "
             "whole graph's in this process, below the served t1 (which adds gRPC and the stub), so the ratio is "
             "the stricter one.\n",
             "| figure | value [range] |", "| --- | --- |"]
    reps = data["reps"]
    per_req = spread([r["cost_per_request_us"] for r in reps])
    ratio = spread([r["fraction_of_t1"] for r in reps])
    look = {role: spread([r["members"][i]["look_cpu_s"] / max(1, r["members"][i]["looks"]) * 1e6 for r in reps])
            for i, role in enumerate(("small", "large"))}
    lines += [f"| share CPU per request | {fmt(per_req, 2)} us |",
              f"| weight syscalls per request | {fmt(spread([r['syscalls_per_request'] for r in reps]), 4)} |",
              f"| a look, the small model (never lowered) | {fmt(look['small'], 1)} us CPU |",
              f"| a look, the large model (lowered) | {fmt(look['large'], 1)} us CPU |",
              f"| note_active per request | {fmt(spread([r['note_active_us'] for r in reps]), 2)} us |",
              f"| parking per request ({m['pool_workers']} workers each way) | "
              f"{fmt(spread([r['park_us'] for r in reps]), 2)} us, "
              f"{fmt(spread([r['park_syscalls_per_request'] for r in reps]), 1)} syscalls |",
              f"| the large model's threads seen at nice | {', '.join(map(str, reps[0]['members'][1]['nices']))} |",
              "", "| figure | ratio [range over repetitions] | goal | verdict |", "| --- | --- | --- | --- |",
              f"| share CPU per request / the small model's t1 | {fmt(ratio, 4)} | <= {GOAL:.0%} | "
              f"{judge_spread(ratio, GOAL, lower_is_better=True)} |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import command_line, machine_meta, write_json
    from lazybatch.backend.os_weights import Privileges
    from lazybatch.shipped import build_pair_repository

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", default="model_repository", help="the pair's repository (built where absent)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="per repetition")
    ap.add_argument("--large-rate", type=float, default=38.0, help="the large model's requests/s (38)")
    ap.add_argument("--large-threads", type=int, default=30, help="its idle threads (30)")
    ap.add_argument("--pool-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="each member's parked pool workers (default: the cores less one, a process pool's)")
    ap.add_argument("--data", default="lazybatch-results/cpu_share_cost.json")
    ap.add_argument("--page", default=None, help="the markdown page (default: printed only)")
    args = ap.parse_args(argv)
    if not Privileges.probe().cap_sys_nice:
        ap.error("needs CAP_SYS_NICE (run as root): without it nothing is lowered, and the lowered looks that cost "
                 "the most would be left out")
    repo = build_pair_repository(args.repository)
    t1 = small_t1(repo)
    rates = {"small": 0.3 / t1, "large": args.large_rate}
    threads = {"small": 10, "large": args.large_threads}
    print(f"small model t1 {t1 * 1e3:.3f} ms: {rates['small']:.1f} requests/s beside {rates['large']:.1f}/s",
          flush=True)
    reps = []
    for k in range(args.reps):
        members = one_rep(args.seconds, rates, threads, seed=k, pool_workers=args.pool_workers)
        requests = sum(m["requests"] for m in members)
        cpu = sum(m["look_cpu_s"] + m["note_active_s"] + m["park_s"] for m in members)
        rep = {"rep": k, "members": members, "cost_per_request_us": cpu / requests * 1e6,
               "fraction_of_t1": cpu / requests / t1, "syscalls_per_request": sum(m["syscalls"] for m in members)
               / requests, "note_active_us": sum(m["note_active_s"] for m in members) / requests * 1e6,
               "park_syscalls_per_request": sum(m["park_syscalls"] for m in members) / requests,
               "park_us": sum(m["park_s"] for m in members) / requests * 1e6}
        reps.append(rep)
        print(f"  rep {k}: {requests} requests, {rep['cost_per_request_us']:.2f} us per request "
              f"({rep['fraction_of_t1']:.3%} of t1), {rep['syscalls_per_request']:.4f} syscalls per request; "
              f"large lowered {members[1]['lowered_s']:.1f} s", flush=True)
    data = {"meta": {**machine_meta(), "command": command_line(), "data": args.data, "t1_ms": t1 * 1e3,
                     "rates": rates, "threads": threads, "reps": args.reps, "seconds": args.seconds,
                     "pool_workers": args.pool_workers},
            "reps": reps}
    write_json(args.data, data)
    text = markdown(data)
    if args.page:
        Path(args.page).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
