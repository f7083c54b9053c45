"""The static-models benchmark's report, from its raw cells: per-cell ratios against the best of Triton's
configurations and the identical copy (the noise floor), the pooled interval over session draws, peaks, the plot;
what ``bench_default`` prints after a run and ``default_page`` renders from docs/data/default.json."""

from __future__ import annotations

import math
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


from benchmarks.harness import count, fmt, judge, spread, verdict
from benchmarks.harness.plots import pyplot, save
from benchmarks.harness.method import FLOOR_BAND, floor_settled, floor_verdict, p99_note
from benchmarks.harness.page import table_head
from lazybatch.client.capacity import ANSWERED, DRIFT


POLICIES = {"eager": "eager", "triton_0us": "triton:0", "triton_5000us": "triton:5000",
            "triton_20000us": "triton:20000", "triton_0us_twin": "triton:0"}

# The twin is a second, identical copy of Triton's stock configuration, measured in turn like the others and scored as
# eager is (best Triton / the twin): this machine's noise floor for one cell (an A/A test), shown beside eager's ratio.
# It is never "best".
TWIN = "triton_0us_twin"
TRITON = [k for k in POLICIES if k.startswith("triton") and k != TWIN]

SLA_MULTIPLE = 5.0  # violations are counted against 5 x t1, the deadline eager's requests carry
MIN_DRAWS = 3  # independent session draws below which the pooled interval is not computed (bench_default.pooled)

BOOTSTRAP_DRAWS = 4000  # resamples of the session draws for the pooled interval (seeded: a re-render prints alike)


def queue_grew(runs: list[dict]) -> float | None:
    """One configuration's runs of a cell (its repetitions): their pooled drift (the request-weighted geometric
    mean of each run's second-half / first-half median latency) where it exceeds DRIFT or a run answered under
    ANSWERED of its sends (then inf); None: sustained. Runs from before drift was kept fall back to their own flag.

    Why pooled: a run of a slow model holds too few requests to judge alone (ResNet-50 at 40%: about 130 in 14 s,
    where client/capacity.py wants MIN_REQUESTS; a median of 65 strays about 12%), and each repetition's arrivals
    are the same for every configuration, so one burst in a second half read 1.2-1.45x for all five of them at
    once. A queue that grows with the run grows in every repetition and shows pooled; a burst in one does not."""
    if any(r.get("sent") and r["ok"] / r["sent"] < ANSWERED for r in runs):
        return math.inf
    weighted = [(math.log(r["drift"]), r["ok"]) for r in runs if r.get("drift") and math.isfinite(r["drift"])]
    if len(weighted) < len(runs):
        return math.inf if any(r.get("sustained") is False for r in runs) else None
    drift = math.exp(sum(d * n for d, n in weighted) / max(sum(n for _, n in weighted), 1))
    return drift if drift > DRIFT else None


def ratios(res: dict, driver: str) -> list[dict]:
    """Per load: best Triton / eager (average, p99, violations) per repetition, and the A/A noise floor.

    "Best Triton" is the configuration with the lowest mean average latency over the repetitions at that load: the
    one a user would deploy for that load. (Picking the best of three per repetition instead compares eager's one
    measurement with the luckiest of three, which favours Triton wherever its configurations behave alike.)"""
    rows = []
    cells = [c for c in res["cells"] if c["driver"] == driver]
    for f in sorted({c["load"] for c in cells}):
        reps = sorted({c["rep"] for c in cells if c["load"] == f})
        by = {(c["rep"], c["policy"]): c for c in cells if c["load"] == f}
        tri = [p for p in TRITON if all((k, p) in by for k in reps)]
        best = min(tri, key=lambda p: sum(by[k, p]["avg_ms"] for k in reps))
        avg, p99, viol, stock, twin, inline, log_diffs = [], [], [], [], [], [], []
        for k in reps:
            e = by[k, "eager"]
            avg.append(by[k, best]["avg_ms"] / e["avg_ms"])
            stock.append(by[k, "triton_0us"]["avg_ms"] / e["avg_ms"])
            p99.append(by[k, best]["p99_ms"] / e["p99_ms"])
            if (k, TWIN) in by:  # the goal's ratio with the twin in eager's place (the same best, the same rule)
                twin.append(by[k, best]["avg_ms"] / by[k, TWIN]["avg_ms"])
                # log(eager's goal ratio / the twin's) in this repetition: the pooled interval's draws (pooled)
                log_diffs.append((k, math.log(by[k, TWIN]["avg_ms"] / e["avg_ms"])))
            if e["violations"] is not None:
                viol.append(by[k, best]["violations"] - e["violations"])
            r = e.get("routes") or {}
            if r.get("inline", 0) + r.get("scheduler", 0):
                inline.append(r["inline"] / (r["inline"] + r["scheduler"]))
        twin_reps = [by[k, best]["avg_ms"] / by[k, TWIN]["avg_ms"] for k in reps if (k, TWIN) in by]
        pols = ("eager", best)
        # eager's throughput over the best's, per repetition: the cell's figure where a queue grew (cell_verdict)
        thr = [e["throughput"] / by[k, best]["throughput"] for k in reps
               if (e := by[k, "eager"])["throughput"] and by[k, best]["throughput"]]
        # requests each p99 rests on, pooled over the repetitions (None: a run from before counts were kept)
        counts = {p: sum(by[k, p].get("requests") or 0 for k in reps)
                  if all(by[k, p].get("requests") is not None for k in reps) else None for p in pols}
        busy = [by[k, p]["busy"] for k in reps for p in pols if by[k, p].get("busy") is not None]
        steal = [by[k, p]["steal"] for k in reps for p in POLICIES if by.get((k, p), {}).get("steal") is not None]
        rows.append({"load": f, "best": best, "avg": spread(avg), "avg_reps": avg, "p99": spread(p99),
                     "stock": spread(stock),
                     "settled": floor_settled(twin_reps), "twin_reps": twin_reps, "requests": counts,
                     "busy": sum(busy) / len(busy) if busy else None,
                     # the hypervisor's share of the machine over every configuration's segments, the segments
                     # measured again for it and those whose steal stayed high (harness/method.py)
                     "steal": sum(steal) / len(steal) if steal else None,
                     "retried": sum(by[k, p].get("retried", 0) for k in reps for p in POLICIES if (k, p) in by),
                     "stolen": sum(by[k, p].get("stolen", 0) for k in reps for p in POLICIES if (k, p) in by),
                     "client_bound": any(by[k, p].get("client_bound") for k in reps for p in pols),
                     # the configurations among eager and the best whose queue grew over the cell's runs (their
                     # pooled drift, queue_grew): a latency there measures that growth, not what a request waits
                     "unsustained": (grew := {p: d for p in pols
                                              if (d := queue_grew([by[k, p] for k in reps])) is not None}),
                     # and the twin's: with any of the three, the cell stays out of the pooled latency figure
                     "copy_grew": (cg := queue_grew([by[k, TWIN] for k in reps if (k, TWIN) in by])),
                     "sustained": not grew and cg is None,
                     "throughput": spread(thr) if thr else None,
                     # runs that measured nothing (perf_analyzer: "Failed to obtain stable measurement")
                     "failed": sum(1 for k in reps for p in POLICIES if (k, p) in by
                                   and not math.isfinite(by[k, p]["avg_ms"])),
                     "viol_diff": spread(viol) if viol else None, "twin": spread(twin) if twin else None,
                     "inline": spread(inline) if inline else None,
                     # mean log ratios over the repetitions, for pooling cells (pooled)
                     "log_avg": sum(map(math.log, avg)) / len(avg),
                     "log_twin": sum(map(math.log, twin)) / len(twin) if twin else None, "log_diffs": log_diffs})
    return rows


def pooled(results: list[dict], driver: str, restart: bool = False, draws: int = BOOTSTRAP_DRAWS) -> dict | None:
    """Eager against an identical copy of Triton's stock configuration, over every cell of these models at once.

    One cell's three repetitions cannot tell a few percent (the twin's own ratio strays as far as eager's), but a
    systematic cost shows in every cell: per cell, the mean log ratio of eager's goal ratio and of the twin's; their
    difference averaged over cells is how far eager is from a policy identical to Triton 0 ms (as a factor: below
    1, eager is behind). Also how many cells the per-cell range rule (harness.verdict) calls met, tie and missed
    for eager and for the twin: the twin's met and missed are that rule's false verdicts. The pooled verdict is the
    same rule on the pooled interval against 1.00.

    The 90% interval resamples session draws, not cells (a cluster bootstrap). Identical onnxruntime sessions run a
    few percent apart (a probe retired to git history), and every cell a server ran shares its sessions: without ``restart``
    one draw per model for all its loads, repetitions and drivers; with it one per (model, driver, repetition).
    Resampling cells counted one slow session seven times as seven independent pieces of evidence, an interval too
    narrow to hold. Under MIN_DRAWS draws there is no interval: the verdict is "unresolved"."""
    diffs, goal, twin, models = [], [], [], []
    units: dict[tuple, list[float]] = {}
    said: dict[str, list[str]] = {"eager": [], "twin": []}
    unsettled = 0  # cells whose noise floor strayed outside its band in a repetition (harness/method.py)
    unsustained = 0  # cells where the queue of eager, the best or the twin grew over the runs (queue_grew)
    for res in results:
        if not any(c["driver"] == driver for c in res["cells"]):
            continue
        models.append(res["model"])
        for r in ratios(res, driver):
            if r["twin"] is None:
                continue
            if not r["sustained"]:  # its averages measure a queue's growth: its verdict is throughput's
                unsustained += 1
                continue
            if not r["settled"]:  # no verdict of its own (harness/method.py): it does not vote in the pool either
                unsettled += 1
                continue
            g, t = r["log_avg"], r["log_twin"]
            goal.append(g)
            twin.append(t)
            diffs.append(g - t)
            for k, d in r["log_diffs"]:
                units.setdefault((res["model"], k) if restart else (res["model"],), []).append(d)
            for who, s in (("eager", r["avg"]), ("twin", r["twin"])):
                said[who].append(verdict(s, 1.0))
    if not diffs and not unsettled + unsustained:  # no cell with an identical copy: nothing to say
        return None
    if not diffs:  # every cell unsettled or unsustained: nothing to pool
        return {"cells": unsettled + unsustained, "models": models, "eager": math.nan, "twin": math.nan, "ratio": math.nan,
                "draws": 0, "restart": restart, "counts": {w: count(v) for w, v in said.items()},
                "unsettled": unsettled, "unsustained": unsustained, "lo": math.nan, "hi": math.nan,
                "verdict": "unresolved (no sustained cell whose noise floor settled within 0.90-1.10x: run longer, "
                           "or at a load the configurations sustain)"}
    n = len(diffs)
    out = {"cells": n + unsettled + unsustained, "models": models, "eager": math.exp(sum(goal) / n), "twin": math.exp(sum(twin) / n),
           "ratio": math.exp(sum(diffs) / n), "draws": len(units), "restart": restart,
           "counts": {w: count(v) for w, v in said.items()}, "unsettled": unsettled, "unsustained": unsustained}
    if len(units) < MIN_DRAWS:
        return out | {"lo": math.nan, "hi": math.nan,
                      "verdict": f"unresolved ({len(units)} session draw(s); run with --restart for more)"}
    lo, hi = draw_interval(list(units.values()), draws)
    return out | {"lo": lo, "hi": hi, "verdict": {"met": "ahead", "missed": "behind"}.get(
        judge(lo, hi, 1.0), "level (the interval straddles 1.00)")}


def draw_interval(units: list[list[float]], draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float]:
    """90% interval of exp(mean log ratio) from resampling whole draws (each a list of log ratios that share one
    pair of sessions), seeded so that a re-render prints the same figures."""
    rng = random.Random(0)
    groups = [(sum(v), len(v)) for v in units]
    boots = sorted(sum(s for s, _ in pick) / sum(m for _, m in pick)
                   for pick in (rng.choices(groups, k=len(groups)) for _ in range(draws)))
    return math.exp(boots[int(0.05 * draws)]), math.exp(boots[int(0.95 * draws) - 1])


def interval(p: dict) -> str:
    """The pooled figure as the pages print it: ratio [90% interval] over N session draws."""
    if math.isnan(p["ratio"]):
        return "no figure [no settled cell]"
    span = "no interval" if math.isnan(p["lo"]) else f"90% interval {p['lo']:.3f}-{p['hi']:.3f}"
    return f"{p['ratio']:.3f} [{span}, {p['draws']} session draws]"


def pooled_line(results: list[dict], driver: str, restart: bool = False) -> list[str]:
    p = pooled(results, driver, restart)
    if p is None:
        return []
    e, t = p["counts"]["eager"], p["counts"]["twin"]
    return [f"**Pooled over {p['cells']} cells ({driver} driver; {', '.join(p['models'])}): eager / an "
            f"identical copy of Triton 0 ms {interval(p)}, {p['verdict']}.** Geometric mean of the cells' goal "
            f"ratio: eager {p['eager']:.3f}, the twin {p['twin']:.3f}. The per-cell range rule called "
            f"{e['missed']} cells missed and {e['met']} met for eager, {t['missed']} missed and {t['met']} met for "
            "the twin (an identical copy: every one of its verdicts is false). "
            f"{p['unsettled']} of the {p['cells']} cells have no verdict and are left out of the pool: their noise "
            f"floor strayed outside {FLOOR_BAND[0]:.2f}-{FLOOR_BAND[1]:.2f} in a repetition. "
            f"{p['unsustained']} are left out too because a queue grew over the runs of eager, the best or the "
            "copy there (an average there measures that growth; where it was eager's or the best's, the cell is "
            "judged on throughput).", ""]


def report(res: dict, driver: str) -> list[str]:
    rows = ratios(res, driver)
    cells = [c for c in res["cells"] if c["driver"] == driver]
    peak = peaks(res, driver)
    sim = res.get("simulated") or {"avg": {}, "p99": {}}
    lines = [f"### {res['model']} ({driver} driver): t1 {res['t1_ms']:.2f} ms, SLA 5 x t1 = {res['sla_ms']:.1f} ms",
             "", *table_head(["load", "best Triton (by mean)", "best Triton avg / eager avg", "avg goal >= 1.00",
                              "noise floor: best Triton avg / twin avg", "best Triton p99 / eager p99",
                              "requests per p99: eager / best Triton", "machine busy",
                              "5x-SLA violations: best Triton - eager (points)", "Triton 0 ms avg / eager avg",
                              "eager requests inline", "simulated ceiling avg / p99"])]
    for r in rows:
        v = r["viol_diff"]
        vs = fmt({k: x * 100 for k, x in v.items()}, 1) if v else "-"
        key = f"{r['load']:g}"
        ceil = f"{sim['avg'][key]:.2f}x / {sim['p99'][key]:.2f}x" if key in sim["avg"] else "-"
        twin = fmt(r["twin"]) if r["twin"] else "-"
        inline = fmt({k: x * 100 for k, x in r["inline"].items()}, 0, "%") if r["inline"] else "-"
        lines.append(f"| {r['load']:.0%} | {r['best'].removeprefix('triton_')} | {fmt(r['avg'])} | "
                     f"{cell_verdict(r)} | {twin} | {fmt(r['p99'])} | {counts(r)} | {busy(r)} | {vs} | "
                     f"{fmt(r['stock'])} | {inline} | {ceil} |")
    best_tri = max(peak[p] for p in TRITON)
    lines += ["", f"Peak throughput: eager {peak['eager']:.1f}/s, best Triton {best_tri:.1f}/s "
                  f"({peak['eager'] / best_tri:.2f}x).", "", served_line(cells, res["t1_ms"])]
    return lines


def cell_verdict(r: dict) -> str:
    """The goal's verdict where the cell's noise floor settled and, for a met or missed, stays clear of the figure
    (harness/method.py), else why there is none (which counts as not met); a client-bound cell says so. Where the
    queue of eager or the best Triton grew over the cell's runs (``queue_grew``), the verdict is on throughput
    (eager's / the best's): an average there measures how fast the queue grew, not a latency a user would see."""
    grew = ", ".join(f"{p.removeprefix('triton_')} {growth(d)}" for p, d in r["unsustained"].items())
    if r["unsustained"] and r.get("throughput"):  # a queue grew: its average is no figure, its throughput is
        said = (f"throughput eager / best Triton {fmt(r['throughput'])}: {verdict(r['throughput'], 1.0)}; "
                f"not sustained ({grew}: a queue grew), so no latency verdict")
    else:
        said = verdict(r["avg"], 1.0)
        if r["twin"] is not None:  # beside its noise floor (harness/method.py): unsettled, or reaching the figure
            said = floor_verdict(r["avg_reps"], r["twin_reps"], not said.startswith("tie")) or said
        if r["unsustained"]:
            said += f"; not sustained ({grew}: a queue grew)"
        elif r.get("copy_grew") is not None:  # the floor measured a queue's growth: the cell stays out of the pool
            said += f"; the copy's queue grew ({growth(r['copy_grew'])}): no floor"
    if r["client_bound"]:
        said += "; client-bound in a repetition"
    if r.get("failed"):
        said += f"; {r['failed']} run(s) measured nothing"
    return said


def growth(drift: float) -> str:
    """``queue_grew``'s figure in the pages' words."""
    return "lost answers" if math.isinf(drift) else f"drift {drift:.2f}x"


def counts(r: dict) -> str:
    c = r["requests"]
    return " / ".join("-" if c[p] is None else p99_note(c[p]) for p in ("eager", r["best"]))


def busy(r: dict) -> str:
    """The machine's busy share, and where the run knew it, the hypervisor's steal with the segments measured again
    for it (and those whose steal stayed high, kept)."""
    if r["busy"] is None:
        return "-"
    if r.get("steal") is None:
        return f"{r['busy']:.0%}"
    kept = f", {r['stolen']} kept stolen" if r.get("stolen") else ""
    return f"{r['busy']:.0%} (steal {r['steal']:.1%}; {r['retried']} remeasured{kept})"


def peaks(res: dict, driver: str) -> dict[str, float]:
    """Per policy, its highest mean throughput over the loads (the sweep's peak)."""
    cells = [c for c in res["cells"] if c["driver"] == driver]
    out = {}
    for p in POLICIES:
        per_load: dict[float, list[float]] = {}
        for c in cells:
            if c["policy"] == p:
                per_load.setdefault(c["load"], []).append(c["throughput"])
        out[p] = max(sum(v) / len(v) for v in per_load.values()) if per_load else math.nan
    return out


def served_line(cells: list[dict], t1_ms: float) -> str:
    """What the driver offered, as served / asked request rate of Triton 0 ms (mean over repetitions): a load is
    its label only where this is near 1 below capacity (perf_analyzer's own schedule offers less over short runs)."""
    parts = []
    for f in sorted({c["load"] for c in cells}):
        got = [c["throughput"] for c in cells if c["policy"] == "triton_0us" and c["load"] == f]
        if got:
            parts.append(f"{f:.0%} {sum(got) / len(got) / (f * 1000 / t1_ms):.2f}")
    return "Served / asked request rate (Triton 0 ms; past capacity it is capped): " + ", ".join(parts) + "."


# how the perf driver's arrivals were drawn, as the report's header says it (runs before --perf-arrivals: its own)
PERF_ARRIVALS = {
    "seeded": " (perf driver: Poisson arrivals drawn with each repetition's own seed, given to perf_analyzer as "
              "--request-intervals)",
    "perf_analyzer": " (perf driver: perf_analyzer's own Poisson schedule, one fixed sequence on every run, so its "
                     "repetitions are the same arrivals)"}


def header(meta: dict) -> list[str]:
    return ["# The default policy (eager) against Triton's dynamic batcher", "",
            f"Measured by `{meta['command']}`, commit `{meta['commit']}`, "
            f"{meta['started']}; {meta['cpu']} ({meta['cores']} cores), onnxruntime {meta['onnxruntime']}, "
            f"tritonclient {meta['tritonclient']}. {meta['reps']} repetitions of {meta['duration_s']:g} s of Poisson "
            "load per policy and load, taking turns"
            + (f" in segments of {meta['segment_s']:g} s (perf_analyzer's at least 3 s; more segments where the p99's "
               "1,000 requests need them; a segment during which the hypervisor took over 2% of the machine, "
               "/proc/stat's steal, measured again: benchmarks/harness/method.py)" if meta.get("segment_s") else "")
            + (" (a fresh tritonserver for every repetition: each draws its own sessions)" if meta.get("restart") else "")
            + (PERF_ARRIVALS[meta.get("perf_arrivals", "perf_analyzer")] if meta.get("driver") in ("perf", "both")
               else "")
            + "; ratios are mean [min-max] over repetitions against the best "
            "of Triton's three configurations at that load (the lowest mean over the repetitions: the one a user "
            "would deploy; the column Triton 0 ms is the stock configuration alone); a range that straddles 1.00 "
            "is a tie. Noise floor: a second, identical copy of Triton's 0 ms configuration (its twin), measured in "
            "turn like the others and scored as eager is (best Triton / the twin): what one cell's ratio can be for "
            "a policy identical to Triton's. "
            "Eager requests inline: the share answered by whole passes in Triton's execute (the rest went through "
            "the scheduler thread, to preempt or merge at stage boundaries). "
            "Simulated ceiling: the same loads on a virtual clock with the table eager read (no serving cost), "
            "best graph:0/5/20 / eager. Raw data: [../data/default.json](../data/default.json).", ""]


def plot(results: list[dict], path: Path) -> bool:
    """Best Triton / eager average latency per load: served (with its spread) beside the simulated ceiling; False
    (nothing drawn) where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, res in zip(axes[0], results):
        for d in sorted({c["driver"] for c in res["cells"]}):
            rows = ratios(res, d)
            x = [r["load"] * 100 for r in rows]
            mean = [r["avg"]["mean"] for r in rows]
            err = [[r["avg"]["mean"] - r["avg"]["min"] for r in rows], [r["avg"]["max"] - r["avg"]["mean"] for r in rows]]
            ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, label=f"served ({d})")
            twin = [(r["load"] * 100, r["twin"]["mean"]) for r in rows if r["twin"]]
            if twin:  # the noise floor: the same ratio for an identical copy of Triton 0 ms
                ax.plot(*zip(*twin), "x", color="grey", label=f"identical copy of Triton 0 ms ({d})")
        sim = res.get("simulated")
        if sim:
            xs = sorted(float(k) for k in sim["avg"])
            ax.plot([v * 100 for v in xs], [sim["avg"][f"{v:g}"] for v in xs], "k--", label="simulated ceiling")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{res['model']} (t1 {res['t1_ms']:.1f} ms)")
        ax.set_xlabel("load (% of batch-1 rate)")
        ax.set_ylabel("best Triton avg / eager avg")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=100)
    return True
