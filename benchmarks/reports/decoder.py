"""The decoder benchmark's goals and report, from its raw cells: what ``bench_decoder`` prints after a run and
``decoder_page`` renders from docs/data/ (the verdicts by the one rule, benchmarks/harness/verdict.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


from benchmarks.harness import fmt, spread, verdict
from benchmarks.harness.page import table_head
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.simulator.loads_on_table import simulate_loads, single_request_ms


POLICIES = {"eager": "eager", "triton_0us": "triton:0", "triton_5000us": "triton:5000",
            "triton_20000us": "triton:20000"}
TRITON = [p for p in POLICIES if p.startswith("triton")]

# --variants: opt-in eager rules served (and replayed) beside the default, taking the same turns; each is reported
# against the best Triton configuration and against eager in the same repetition. eager_join: a newcomer joins the
# running decode only where that lowers the predicted summed completion time (batcher/policies/eager.py, join=benefit).
VARIANTS = {"eager_join": "eager:join=benefit"}
GOALS = {"lm": (3.0, 3.0, 2.0)}  # (avg, p99, peak throughput) at 70-150%; seq2seq: (1.5, -, -) there, 1.0 elsewhere

# The same loads on a virtual clock, on the latency table the server's policies read (no serving cost): Triton's
# batcher at N ms is graph:N there (batcher/policies/graph_batching.py decodes a batch to its longest member's end).
# eager_eq2: eager with the paper's Eq. 2 admission in place of the batch curves (batcher/decode_admission.py), the
# rule served before commit 02bfdaa: what the curves change, on the same table.
SIM_POLICIES = {"eager": "eager", "eager_eq2": "eager:admission=eq2", "triton_0us": "graph:0",
                "triton_5000us": "graph:5", "triton_20000us": "graph:20"}
SIM_SEEDS, SIM_REQUESTS = 3, 400


def simulated(table: LatencyTable, hist: LengthHistogram, loads: list[float], sla_ms: float,
              variants: list[str] = ()) -> dict:
    """The loads replayed on the model's own latency table and length histogram (lazybatch/simulator/
    loads_on_table.py): what the policies give with no serving cost, so that a gap between the algorithm and the
    server shows. Loads are fractions of the table's own batch-1 rate; the deadline is the served SLA."""
    t1 = single_request_ms(table, hist)
    return simulate_loads(table, loads, max_batch_size=table.max_batch_size, sla_multiples=[sla_ms / t1],
                          sched_multiple=sla_ms / t1, policies={**SIM_POLICIES, **{v: VARIANTS[v] for v in variants}},
                          seeds=SIM_SEEDS, requests=SIM_REQUESTS, histogram=hist, t1_ms=t1).as_dict()


def by_load(cells: list[dict]):
    """Per load: the repetitions where eager was measured, the cells by (repetition, policy), and the best Triton
    configuration by mean over them. A configuration perf_analyzer measured nothing of in one of them (no request
    ended inside its windows) is not a candidate for best: its latency there is past a window, and leaving it out
    can only make Triton's best look better. None where no Triton configuration was measured in every one."""
    for f in sorted({c["load"] for c in cells}):
        by = {(c["rep"], c["policy"]): c for c in cells if c["load"] == f}
        reps = sorted(k for k in {c["rep"] for c in cells if c["load"] == f} if by[k, "eager"]["avg_ms"] is not None)
        measured = [p for p in TRITON if all(by[k, p]["avg_ms"] is not None for k in reps)]
        yield f, reps, by, min(measured, key=lambda p: sum(by[k, p]["avg_ms"] for k in reps), default=None)


def measured_nothing(cells: list[dict]) -> list[str]:
    """The cells perf_analyzer measured nothing of, one phrase each (load, policy, repetition)."""
    return [f"{c['policy']} at {c['load']:.0%}, repetition {c['rep'] + 1}" for c in cells if c.get("measured_nothing")]


def peak_throughput(cells: list[dict]) -> dict[str, float]:
    """Per policy, its best load's mean throughput over the repetitions (/s): the peak a sweep shows."""
    def mean(p: str, f: float) -> float:
        got = [c["throughput"] for c in cells if c["policy"] == p and c["load"] == f and c["throughput"] is not None]
        return statistics.fmean(got) if got else 0.0
    return {p: max(mean(p, f) for f in {c["load"] for c in cells}) for p in POLICIES}


def peak_ratios(cells: list[dict]) -> list[float]:
    """Per repetition, eager's peak throughput over the loads / the best Triton configuration's (best by its mean
    peak, ``peak_throughput``): the figure the peak-throughput goal is judged on, with its spread."""
    peak = peak_throughput(cells)
    best = max(TRITON, key=lambda p: peak[p])

    def at(p: str, k: int) -> float:
        got = [c["throughput"] for c in cells if c["policy"] == p and c["rep"] == k and c["throughput"] is not None]
        return max(got, default=0.0)
    return [at("eager", k) / at(best, k) for k in sorted({c["rep"] for c in cells}) if at(best, k) > 0]


def report(res: dict) -> list[str]:
    cells = res["cells"]
    kind = res["model"]
    driver = res.get("driver", "load")
    lines = [f"### {kind}: t1 {res['t1_ms']:.1f} ms (batch-1 rate {1e3 / res['t1_ms']:.2f}/s)"
             + (", load from perf_analyzer" if driver == "perf_analyzer" else "")
             + (" (Poisson arrivals drawn with each repetition's seed)" if res.get("perf_arrivals") == "seeded"
                else ""), "",
             *table_head(["load", "best Triton (by mean)", "best Triton avg / eager avg", "goal",
                          "best Triton p99 / eager p99", "goal", "eager avg / p99 ms", "best Triton avg / p99 ms",
                          "throughput eager / best Triton (/s)"])]
    for f, reps, by, best in by_load(cells):
        if best is None or not reps:
            lines.append(f"| {f:.0%} | none measured in every repetition | - | - | - | - | - | - | - |")
            continue
        avg = spread([by[k, best]["avg_ms"] / by[k, "eager"]["avg_ms"] for k in reps])
        p99 = spread([by[k, best]["p99_ms"] / by[k, "eager"]["p99_ms"] for k in reps])
        in_band = 0.7 <= f <= 1.5
        g_avg, g_p99, _ = GOALS.get(kind, (1.5, None, None))
        goal_avg = g_avg if in_band else 1.0
        e = [by[k, "eager"] for k in reps]
        b = [by[k, best] for k in reps]
        lines.append(
            f"| {f:.0%} | {best.removeprefix('triton_')} | {fmt(avg)} | >= {goal_avg:g}: {verdict(avg, goal_avg)} | "
            f"{fmt(p99)} | {verdict(p99, g_p99) if g_p99 and in_band else '-'} | "
            f"{statistics.fmean(c['avg_ms'] for c in e):.0f} / {statistics.fmean(c['p99_ms'] for c in e):.0f} | "
            f"{statistics.fmean(c['avg_ms'] for c in b):.0f} / {statistics.fmean(c['p99_ms'] for c in b):.0f} | "
            f"{statistics.fmean(c['throughput'] for c in e):.2f} / {statistics.fmean(c['throughput'] for c in b):.2f} |")
    peak = peak_throughput(cells)
    best_tri = max(peak[p] for p in TRITON)
    goal_peak = GOALS.get(kind, (None, None, None))[2]
    per_rep = peak_ratios(cells)
    lines += ["", f"Peak throughput over these loads: eager {peak['eager']:.2f}/s, best Triton {best_tri:.2f}/s "
                  f"({peak['eager'] / best_tri:.2f}x on the means"
                  + (f"; per repetition {min(per_rep):.2f}-{max(per_rep):.2f}x" if per_rep else "")
                  + (f"; goal >= {goal_peak:g}x: {verdict(spread(per_rep), goal_peak)}" if goal_peak and per_rep
                     else "") + ")."]
    if driver == "perf_analyzer":
        lines.append("Errors: none (perf_analyzer stops at the first failed request; every cell completed).")
        if nothing := measured_nothing(cells):
            lines.append(f"Measured nothing (no request ended inside perf_analyzer's windows; not a candidate for "
                         f"best Triton at that load): {'; '.join(nothing)}.")
    else:
        lines.append(f"Errors: {sum(c['errors'] for c in cells)} of {sum(c['sent'] for c in cells)} requests.")
    for v in sorted({c["policy"] for c in cells} & set(VARIANTS)):
        lines += [""] + variant_report(res, v)
    if "simulated" in res:
        lines += [""] + simulated_report(res["simulated"])
    return lines


def variant_report(res: dict, variant: str) -> list[str]:
    """An opt-in rule against the best Triton configuration and against eager, repetition by repetition (the same
    requests at the same send times), served and on the replay."""
    cells, sim = res["cells"], {(c["load"], c["policy"]): c for c in res.get("simulated", {}).get("cells", [])}
    lines = [f"Variant `{variant}` ({VARIANTS[variant]}), same turns as the table above:", "",
             *table_head(["load", "best Triton avg / variant avg", "eager avg / variant avg", "eager p99 / variant p99",
                          "variant avg / p99 ms", "simulated: best Triton / variant, eager / variant"])]
    for f, reps, by, best in by_load(cells):
        reps = [k for k in reps if by[k, variant]["avg_ms"] is not None]
        if best is None or not reps:
            continue
        v = [by[k, variant] for k in reps]
        ratio = lambda pol, key: spread([by[k, pol][key] / by[k, variant][key] for k in reps])  # noqa: E731
        s = ""
        if (f, variant) in sim:
            sb = min(TRITON, key=lambda p: sim[f, p]["avg_ms"])
            s = (f"{sim[f, sb]['avg_ms'] / sim[f, variant]['avg_ms']:.2f}, "
                 f"{sim[f, 'eager']['avg_ms'] / sim[f, variant]['avg_ms']:.2f}")
        lines.append(f"| {f:.0%} | {fmt(ratio(best, 'avg_ms'))} | {fmt(ratio('eager', 'avg_ms'))} | "
                     f"{fmt(ratio('eager', 'p99_ms'))} | {statistics.fmean(c['avg_ms'] for c in v):.0f} / "
                     f"{statistics.fmean(c['p99_ms'] for c in v):.0f} | {s or '-'} |")
    return lines


def simulated_report(sim: dict) -> list[str]:
    """The virtual-clock replay beside the served table: the ceiling the algorithm reaches on this table."""
    by = {(c["load"], c["policy"]): c for c in sim["cells"]}
    lines = [f"Simulated on this run's latency table (no serving cost; t1 {sim['t1_ms']:.1f} ms, {sim['seeds']} seeds "
             f"x {sim['requests']} requests per cell; Triton's batcher at N ms is graph:N):", "",
             *table_head(["load", "best Triton (by mean)", "best Triton avg / eager avg", "best Triton p99 / eager p99",
                          "eager avg / p99 ms", "eager with Eq. 2 admission avg / p99 ms", "best Triton avg / p99 ms",
                          "throughput eager / best Triton (/s)"])]
    for f in sorted({c["load"] for c in sim["cells"]}):
        best = min(TRITON, key=lambda p: by[f, p]["avg_ms"])
        e, b, q = by[f, "eager"], by[f, best], by.get((f, "eager_eq2"))
        eq2 = f"{q['avg_ms']:.0f} / {q['p99_ms']:.0f}" if q else "-"
        lines.append(f"| {f:.0%} | {best.removeprefix('triton_')} | {b['avg_ms'] / e['avg_ms']:.2f} | "
                     f"{b['p99_ms'] / e['p99_ms']:.2f} | {e['avg_ms']:.0f} / {e['p99_ms']:.0f} | {eq2} | "
                     f"{b['avg_ms']:.0f} / {b['p99_ms']:.0f} | {e['throughput']:.2f} / {b['throughput']:.2f} |")
    return lines
