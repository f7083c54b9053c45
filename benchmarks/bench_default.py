"""The default policy (eager) against Triton's own dynamic batcher at its best, on a real tritonserver: the
standing guard of "never worse than the stock batcher" on a model alone. Any change to the default (a policy, a
parameter's default, a mechanism that is on by default such as the CPU share) runs it before it lands, on a fast
model and a slow one at least (docs/architecture.md, "Changing the default").

    python -m benchmarks.bench_default             # tiny (about 1 ms served), MLP, BERT, ResNet-50, MobileNet-v1
    python -m benchmarks.bench_default --models tiny,mlp,resnet50 --reps 3 --restart --out lazybatch-results/default
    python -m benchmarks.bench_default --models tiny,resnet50 --before main   # a change before against after

Goal ("never slower than Triton's own batcher", docs/results/default.md): best Triton dynamic-batcher config (0/5/20 ms queue delay)
average latency / eager's >= 1.00 at every load from 10% to 300% of the batch-1 rate, p99 and 5x-SLA violations no
worse, peak throughput no lower; under `lazybatch load` (client/load.py, open-loop Poisson) and under NVIDIA
perf_analyzer (Poisson, --async).

Per model, one tritonserver serves it under eager and under Triton's batcher at 0, 5 and 20 ms. The batch-1 rate mu
is measured first on triton_0us (sequential requests, with the cores ours). Then, at each load, every repetition
runs every policy for ``--duration`` s, taking turns in segments of ``--segment`` s (the order turns round every
segment), so that a spell of noise falls on all of them; the number of segments is fixed before the run, raised
where the p99's 1,000 requests need it. A segment during which the hypervisor took more than 2% of the machine
(/proc/stat's steal: on this 2-core VM, spells of seconds to a minute that slowed every configuration 2-7x) is
measured again after a pause (benchmarks/harness/method.py). With
``--restart`` every repetition runs every load on a server of its own, started afresh: identical onnxruntime sessions
run a few percent apart, and one server for all repetitions gives every cell of a policy the same draw. "Best
Triton" at a load is the configuration with the lowest mean average over the repetitions. Ratios are reported as
mean [min-max] over repetitions; a range that straddles 1.00 is a tie. A second copy of Triton's 0 ms configuration
(the twin) runs in turn too, and the same ratio is computed for it in eager's place (best Triton / the twin): what a
policy identical to Triton's stock configuration scores here, the noise floor of each cell. Pooled over a model set's
cells, eager's ratio over the twin's, with a bootstrap interval over the session draws (one per server: use
``--restart`` for a verdict), says whether eager is behind an identical copy by more than this machine resolves
(``pooled``). Eager's route counts per cell (inline in execute, or through
the scheduler thread) come from the backend's statistics file. The raw cells go to OUT/default.json.

``--before REV``: one more configuration, ``eager_before``, serves the default from the code at git revision REV
(its own model directory, whose model.py puts that tree first on the stub's path: each model is a stub process of
its own), taking turns with the others in the same server; the page adds eager before / after per load beside the
twin's floor: a change to the default, before against after, in one run.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from tqdm import tqdm

from benchmarks.harness import add_perf_arrivals_arg, command_line, machine_meta, start_server, static_t1, write_json
from benchmarks.harness.measure import load_segment, pool_load
from benchmarks.harness.method import segments_for, while_ours
from benchmarks.harness.page import write_page
from lazybatch.client.load import run_load
from lazybatch.shipped import KIND_SLA_MS, build_default_repository
from lazybatch.serving import TritonServer
from benchmarks.harness import fmt, spread
from benchmarks.harness.method import floor_note, floor_reaches, floor_settled
from benchmarks.harness.page import table_head
from benchmarks.reports.default import POLICIES, SLA_MULTIPLE, TWIN, pooled_line, ratios, report


BEFORE = "eager_before"  # the default served from an earlier revision (--before), never "best"
PERF_MIN_SEGMENT_S = 3.0  # perf_analyzer's three measurement windows of at least 1 s each

# perf_analyzer's default data is random bytes: in BERT's int64 token ids those fall outside the vocabulary, the
# model answers every request with its error (as it should) and perf_analyzer stops at the first. Zeros are valid
# ids ([PAD]); BERT's time does not depend on the ids. Every other model keeps perf_analyzer's default data.
PERF_INPUT_DATA = {"bert": "zero"}


def drive_perf(url: str, model: str, rate: float, duration: float, sla_ms: float, seed: int, out: Path,
               input_data: str | None = None, seeded_arrivals: bool = False) -> dict:
    from lazybatch import perf as pa

    rows, text = pa.run(pa.find_perf_analyzer() or pa.install(), model, url, [rate], out / "perf" / f"{model}_{seed}",
                     # three windows that make up the cell's duration; the repetitions are ours, so any three
                     # windows count as "stable" for perf_analyzer (else it gives up on a loaded 2-core machine).
                     # A window holds at least 10 expected arrivals: perf_analyzer fails a run with a window where
                     # no request ended (seeded arrivals at 4/s did, in 1 s windows)
                     measurement_ms=max(1000, int(duration * 1000 / 3), int(10_000 / rate)), sla_ms=sla_ms,
                     input_data=input_data,
                     max_trials=3, stability_percentage=1000.0, poisson_seed=seed if seeded_arrivals else None)
    r = rows[-1]
    # the requests its figures rest on: perf_analyzer's "Request count" of the measurement it reported; its pace is
    # its own (it prints no send rate), so a perf cell is never called client-bound here
    counts = re.findall(r"Request count: (\d+)", text)
    return {"avg_ms": r.avg_ms, "p99_ms": r.p99_ms, "throughput": r.throughput,
            "requests": int(counts[-1]) if counts else 0}


def pool_perf(segs: list[dict]) -> dict:
    """A cell's figures from its perf_analyzer segments: the request-weighted mean of their averages (exact) and of
    their p99s (perf_analyzer reports no per-request latencies: an estimate of the pooled p99), the throughput
    averaged; a segment that measured nothing makes the cell's figures NaN (named as failed)."""
    n = sum(g["requests"] for g in segs)
    if not segs or not n or any(not math.isfinite(g["avg_ms"]) for g in segs):
        return {"sent": None, "ok": None, "errors": None, "avg_ms": math.nan, "p99_ms": math.nan,
                "throughput": math.nan, "violations": None, "requests": n, "client_bound": None}
    return {"sent": None, "ok": None, "errors": None,
            "avg_ms": sum(g["avg_ms"] * g["requests"] for g in segs) / n,
            "p99_ms": sum(g["p99_ms"] * g["requests"] for g in segs) / n,
            "throughput": sum(g["throughput"] for g in segs) / len(segs), "violations": None, "requests": n,
            "client_bound": None}


def schedule(drivers: list[str], loads: list[float], reps: int, restart: bool) -> list[tuple[str, float, int]]:
    """The cells' order as (driver, load, repetition): a load's repetitions one after another on one server, or
    with ``restart`` each repetition's loads together, so that a fresh server per repetition starts once."""
    if restart:
        return [(d, f, k) for d in drivers for k in range(reps) for f in loads]
    return [(d, f, k) for d in drivers for f in loads for k in range(reps)]


def before_tree(rev: str, dest: Path) -> Path:
    """The lazybatch packages at git revision ``rev`` laid out as one importable tree under ``dest`` (the mapping
    of pyproject.toml's package-dir: lazybatch/ at the top, batcher/ as lazybatch/batcher, ...)."""
    import shutil
    import subprocess
    import tarfile
    import tempfile

    folders = {"lazybatch": "lazybatch", "batcher": "lazybatch/batcher", "backend": "lazybatch/backend",
               "npu_model": "lazybatch/npu_model", "client": "lazybatch/client", "sessions": "lazybatch/sessions",
               "formats": "lazybatch/formats"}
    shutil.rmtree(dest, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "tree.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, *folders], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        for src, to in folders.items():  # the top package first: the others go inside it
            shutil.copytree(Path(tmp) / src, dest / to, dirs_exist_ok=True)
    return dest


def serve_before(model_dir: Path, tree: Path) -> None:
    """``model_dir`` serves the default from ``tree`` (``before_tree``), and refuses to load from anything else."""
    (model_dir / "1" / "model.py").write_text(
        f'"""The default before a change (benchmarks/bench_default.py --before): lazybatch from {tree}."""\n'
        f"import sys\nsys.path.insert(0, {str(tree)!r})\nimport lazybatch\n"
        f"if not lazybatch.__file__.startswith({str(tree)!r}):\n"
        f"    raise ImportError('lazybatch came from ' + lazybatch.__file__ + ', not {tree}')\n"
        "from lazybatch.backend.model import TritonPythonModel  # noqa: E402,F401\n")


def before_lines(res: dict, driver: str) -> list[str]:
    """With ``--before``: per load, eager before / after (average and p99: above 1.00 the change made it faster)
    per repetition, beside the twin's floor (Triton 0 ms / its identical copy, scored by the same rule): level where
    the two ranges meet, no verdict where the floor strayed outside its band (harness/method.py)."""
    by = {(c["rep"], c["policy"], c["load"]): c for c in res["cells"] if c["driver"] == driver}
    loads = sorted({f for _, p, f in by if p == BEFORE})
    if not loads:
        return []
    lines = ["", *table_head(["load", "eager before avg / after avg", "before p99 / after p99",
                              "noise floor: Triton 0 ms avg / twin avg", "requests after / before"])]
    for f in loads:
        reps = sorted(k for k, p, g in by if p == BEFORE and g == f and (k, "eager", f) in by)
        cell = [(by[k, BEFORE, f], by[k, "eager", f], by.get((k, "triton_0us", f)), by.get((k, TWIN, f)))
                for k in reps]
        per_rep = [b["avg_ms"] / a["avg_ms"] for b, a, _, _ in cell]
        avg = spread(per_rep)
        p99 = spread([b["p99_ms"] / a["p99_ms"] for b, a, _, _ in cell])
        floor = [t["avg_ms"] / w["avg_ms"] for _, _, t, w in cell if t and w]
        n = f"{sum(a['requests'] for _, a, _, _ in cell):,} / {sum(b['requests'] for b, _, _, _ in cell):,}"
        if not floor_settled(floor):
            said = floor_note(floor)
        elif floor_reaches(per_rep, floor):
            said = "level: within the floor"
        elif avg["max"] < min(floor):
            said = "the change made it slower: below the floor"
        else:
            said = "the change made it faster: above the floor"
        lines.append(f"| {f:.0%} | {fmt(avg)}: {said} | {fmt(p99)} | {fmt(spread(floor)) if floor else '-'} | {n} |")
    return lines


def bench_model(kind: str, args: argparse.Namespace, out: Path) -> dict:
    policies = {**POLICIES, **({BEFORE: POLICIES["eager"]} if args.before else {})}
    repo = build_default_repository(out / "repos" / kind, kind=kind, work=out / "build" / kind,
                                    policies=policies, profile_reps=5)
    if args.before:
        serve_before(repo / f"{kind}_{BEFORE}", (out / "before_tree").resolve())
    stats_dir = out / "stats" / kind  # the backend's statistics (LAZYBATCH_STATS_DIR): which route eager took
    for old in stats_dir.glob("*.batches.csv"):  # the stubs append to their batch logs: this run's passes only
        old.unlink()
    drivers = ["load", "perf"] if args.driver == "both" else [args.driver]
    run = CellRunner(kind, repo, stats_dir, out, args, list(policies))
    try:
        cells = run.cells(schedule(drivers, args.loads, args.reps, args.restart), args.duration)
        res = {"model": kind, "t1_ms": run.t1 * 1e3, "sla_ms": run.sla_ms, "cells": cells, "settle_rounds": []}
        duration = args.duration
        for _ in range(args.settle):  # the method's rule: an unsettled noise floor is rerun longer
            unsettled = [(d, r["load"]) for d in drivers for r in ratios(res, d) if not r["settled"]]
            if not unsettled:
                break
            duration *= 2
            tqdm.write(f"[{kind}] noise floor outside its band at {', '.join(f'{d} {f:.0%}' for d, f in unsettled)}:"
                       f" rerun at {duration:g} s")
            steps = [st for st in schedule(drivers, args.loads, args.reps, args.restart) if st[:2] in unsettled]
            again = run.cells(steps, duration, restart_all=True)
            res["cells"] = [c for c in res["cells"] if (c["driver"], c["load"]) not in unsettled] + again
            res["settle_rounds"].append({"duration_s": duration, "cells": [list(u) for u in unsettled]})
    finally:
        run.close()
    res["simulated"] = simulated(repo / f"{kind}_eager" / "1" / "latency.json", args.loads)
    return res


class CellRunner:
    """Runs cells (driver, load, repetition: every policy in turn) on one model's server, started afresh per
    repetition with ``--restart``; t1 and the SLA are measured once, so that every cell offers the same rates."""

    def __init__(self, kind: str, repo: Path, stats_dir: Path, out: Path, args: argparse.Namespace,
                 policies: list[str]) -> None:
        self.kind, self.repo, self.stats_dir, self.out, self.args = kind, repo, stats_dir, out, args
        self.policies = policies  # the model directories measured in turn: POLICIES, and eager_before (--before)
        self.t1 = self.sla_ms = math.nan
        self.server: TritonServer | None = None
        self.started: tuple[str, int] | None = None  # the (driver, repetition) the running server was started for
        self.seen: dict = {}

    def _server_for(self, driver: str, k: int, fresh: bool) -> str:
        args = self.args
        if self.server is None or fresh or (args.restart and (driver, k) != self.started):
            self.close()
            for old in self.stats_dir.glob("*.json"):  # a fresh server's counters start at zero
                old.unlink()
            self.seen = {}
            log = (f"tritonserver_{self.kind}_{driver}_rep{k}.log" if args.restart
                   else f"tritonserver_{self.kind}.log")
            self.server = start_server(self.repo, self.out / log, stats_dir=self.stats_dir)
            self.started = (driver, k)
            if math.isnan(self.t1):  # measured once: every repetition offers the same request rates
                url = self.server.endpoints.grpc  # ... with the cores ours: a stolen t1 offers every cell less
                self.t1, _ = while_ours(lambda: static_t1(url, self.kind))
                self.sla_ms = SLA_MULTIPLE * self.t1 * 1e3
                tqdm.write(f"[{self.kind}] t1 {self.t1 * 1e3:.2f} ms (batch-1 rate {1 / self.t1:.1f}/s), "
                           f"SLA {self.sla_ms:.1f} ms")
        return self.server.endpoints.grpc

    def cells(self, steps: list[tuple[str, float, int]], duration: float, restart_all: bool = False) -> list[dict]:
        """Every policy at each step, taking turns in segments (``--segment`` s each; the order turns round every
        segment, and starts from the other end every repetition) until each has ``duration`` s of load, or more
        where that falls short of the p99's request floor over the repetitions (method.segments_for); a segment
        the hypervisor stole from is measured again (method.STEAL_MAX). With ``restart_all`` the first step starts
        a fresh server too (a settle round after the main run)."""
        args, kind = self.args, self.kind
        cells: list[dict] = []
        for i, (driver, f, k) in enumerate(tqdm(steps, desc=kind, unit="cell")):
            url = self._server_for(driver, k, fresh=restart_all and i == 0)
            rate = f / self.t1
            seg_s = max(args.segment, PERF_MIN_SEGMENT_S) if driver == "perf" else args.segment
            n = segments_for(rate, seg_s, args.reps, minimum=max(1, round(duration / seg_s)))
            pols = self.policies
            segs: dict[str, list[dict]] = {p: [] for p in pols}
            meta = {p: {"busy": [], "steal": [], "retried": 0, "stolen": 0} for p in pols}
            for j in range(n):
                order = pols if (j + k) % 2 == 0 else pols[::-1]
                for pol in order:
                    seg, m = self._segment(driver, url, pol, rate, seg_s, seed=1000 * k + j)
                    segs[pol].append(seg)
                    for key in ("busy", "steal"):
                        meta[pol][key].append(m[key])
                    meta[pol]["retried"] += m["retried"]
                    meta[pol]["stolen"] += m["stolen"]
            for pol in pols:
                model = f"{kind}_{pol}"
                c = pool_load(segs[pol], self.sla_ms) if driver == "load" else pool_perf(segs[pol])
                mm = meta[pol]
                c.update(busy=float(np.mean(mm["busy"])), steal=float(np.mean(mm["steal"])),
                         segments=n, segment_s=seg_s, retried=mm["retried"], stolen=mm["stolen"],
                         duration_s=n * seg_s)
                if pol == "eager":
                    time.sleep(0.3)  # the statistics file is written when the scheduler goes idle
                    c["routes"], self.seen = routes(self.stats_dir / f"{model}.json", self.seen)
                cells.append({"driver": driver, "load": f, "rep": k, "policy": pol, **c})
        return cells

    def _segment(self, driver: str, url: str, pol: str, rate: float, seg_s: float, seed: int) -> tuple[dict, dict]:
        """One segment of one policy, measured again while the hypervisor stole from it (method.while_ours): the
        segment and its busy, steal, retries and whether its steal stayed high."""
        model = f"{self.kind}_{pol}"
        if driver == "load":
            seg, turn = while_ours(lambda: load_segment(run_load(url, model, rate, seg_s, sla_ms=self.sla_ms, seed=seed,
                                                                 timeout_s=120.0), seg_s))
        else:
            seg, turn = while_ours(lambda: drive_perf(url, model, rate, seg_s, self.sla_ms, seed=seed, out=self.out,
                                                      input_data=PERF_INPUT_DATA.get(self.kind),
                                                      seeded_arrivals=self.args.perf_arrivals == "seeded"))
        return seg, {"busy": turn.busy, "steal": turn.steal, "retried": turn.retried, "stolen": int(turn.stolen)}

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def routes(path: Path, before: dict) -> tuple[dict, dict]:
    """The route eager's requests took in one cell, from the backend's cumulative statistics file (written when its
    scheduler goes idle, which the pause after each cell leaves time for): requests answered by whole passes in
    ``execute`` (inline) and through the scheduler thread, and why groups went to the scheduler."""
    import json

    try:
        now = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, before
    refused = {k: v - before.get("inline_refused", {}).get(k, 0) for k, v in now.get("inline_refused", {}).items()}
    d = {k: now.get(k, 0) - before.get(k, 0) for k in ("requests", "inline_requests", "inline_groups", "span_runs")}
    return {"inline": d["inline_requests"], "scheduler": d["requests"] - d["inline_requests"],
            "inline_groups": d["inline_groups"], "span_runs": d["span_runs"],
            "refused": {k: v for k, v in refused.items() if v}}, now


def simulated(table_path: Path, loads: list[float]) -> dict:
    """The ceiling: the same loads on a virtual clock with the table eager reads, no serving cost
    (lazybatch/simulator/loads_on_table.py): best graph:0/5/20 average / eager's per load."""
    from lazybatch.batcher.latency_table import LatencyTable
    from lazybatch.simulator.loads_on_table import simulate_loads

    table = LatencyTable.load(table_path)
    pols = {"eager": "eager", "graph_0ms": "graph:0", "graph_5ms": "graph:5", "graph_20ms": "graph:20"}
    sim = simulate_loads(table, loads, max_batch_size=table.max_batch_size, policies=pols, seeds=3, requests=1000)
    out = {"t1_ms": sim.t1_ms, "avg": {}, "p99": {}}
    for f in loads:
        graphs = [sim.cell(f, p) for p in pols if p != "eager"]
        eager = sim.cell(f, "eager")
        out["avg"][f"{f:g}"] = min(c["avg_ms"] for c in graphs) / eager["avg_ms"]
        out["p99"][f"{f:g}"] = min(c["p99_ms"] for c in graphs) / eager["p99_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,mlp,bert,resnet50,mobilenet",
                    help="shipped kinds: tiny (about 1 ms served) and mlp are the fast models, resnet50 the slow one")
    ap.add_argument("--loads", default="0.1,0.4,0.7,0.9,1.5", help="fractions of the batch-1 rate")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=12.0,
                    help="seconds of load per policy and cell (more where the p99's 1,000 requests need it)")
    ap.add_argument("--segment", type=float, default=2.0,
                    help="seconds of one turn: the policies take turns in segments this long (perf_analyzer's at "
                         f"least {PERF_MIN_SEGMENT_S:g} s), so that a spell of noise falls on all of them")
    ap.add_argument("--driver", choices=("load", "perf", "both"), default="both",
                    help="both: lazybatch's load generator and NVIDIA perf_analyzer, each judged on its own")
    add_perf_arrivals_arg(ap, "perf driver")
    ap.add_argument("--restart", action="store_true",
                    help="a fresh tritonserver for every repetition: each repetition then draws its own sessions "
                         "(identical sessions run a few percent apart, docs/results/default.md), which one server "
                         "for all repetitions carries into every cell of a policy")
    ap.add_argument("--settle", type=int, default=1,
                    help="rounds of rerunning, at twice the length each, the loads whose noise floor (the identical "
                         "copy) strayed outside 0.90-1.10x in a repetition (benchmarks/harness/method.py); 0: none")
    ap.add_argument("--before", metavar="REV", default=None,
                    help="also serve the default from this git revision (eager_before) and report before / after")
    ap.add_argument("--out", default="lazybatch-results/default")
    ap.add_argument("--json", default=None, help="also copy the raw results here (e.g. docs/data/default.json)")
    args = ap.parse_args(argv)
    args.loads = [float(v) for v in args.loads.split(",")]
    out = Path(args.out)
    meta = {**machine_meta(), "command": command_line(), "reps": args.reps, "duration_s": args.duration,
            "segment_s": args.segment, "settle": args.settle,
            "loads": args.loads, "driver": args.driver, "restart": args.restart, "perf_arrivals": args.perf_arrivals,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "before": args.before}
    if args.before:
        before_tree(args.before, out / "before_tree")
    results = []
    for kind in args.models.split(","):
        if kind not in KIND_SLA_MS:
            ap.error(f"unknown model {kind!r}")
        results.append(bench_model(kind, args, out))
        data = {"meta": meta, "results": results}
        write_json(out / "default.json", data)  # after every model: a long run keeps what it measured
    drivers = ["load", "perf"] if args.driver == "both" else [args.driver]
    lines = [line for res in results for d in drivers for line in report(res, d) + before_lines(res, d) + [""]]
    lines += [line for d in drivers for line in pooled_line(results, d, args.restart)]
    write_page(out / "default.md", lines)
    print("\n".join(lines))
    if args.json:
        write_json(args.json, {"meta": meta, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
