"""The streaming benchmark's goal and report (time to first token under load against unloaded), from its raw
cells: what ``bench_streaming`` prints after a run and ``streaming_page`` renders from docs/data/."""

from __future__ import annotations

import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


from benchmarks.harness import fmt, judge_spread, spread, verdict
from benchmarks.harness.page import table_head


MODELS = ("lm", "gnmt", "transformer")  # the models that generate tokens (repo kinds)
POLICIES = {"eager": "eager", "eager_curves": "eager:admission=curves", "triton_0us": "triton:0",
            "triton_5000us": "triton:5000", "triton_20000us": "triton:20000"}

TRITON = [p for p in POLICIES if p.startswith("triton")]
GOAL = 2.0  # TTFT at 90% load / unloaded TTFT, at most

GOAL_LOAD = 0.9


def report(res: dict) -> list[str]:
    cells, base = res["cells"], res["unloaded"]

    def unl(p: str, key: str, digits: int = 1) -> str:
        return fmt(spread([b[p][key] for b in base]), digits)

    driver = cells[0].get("driver", "load") if cells else "load"
    lines = [f"{res['model']}, loaded by {'perf_analyzer' if driver != 'load' else 'lazybatch load'}: "
             f"t1 {res['t1_ms']:.1f} ms (batch-1 rate {1e3 / res['t1_ms']:.2f}/s), a response every "
             f"{res.get('stream_interval_tokens', 1)} token(s). Unloaded TTFT / time per "
             "output token (ms): " + "; ".join(f"{p} {unl(p, 'ttft_ms')} / {unl(p, 'tpot_ms', 2)}" for p in POLICIES),
             "", *table_head(["load", "eager TTFT / unloaded", "goal", "eager TTFT avg / p99 ms", "eager TPOT ms",
                              "eager_curves TTFT / unloaded", "its TTFT avg / p99 ms", "its TPOT ms",
                              "best Triton (by TTFT)", "its TTFT avg / p99 ms", "its TPOT ms",
                              "best Triton TTFT / eager TTFT"])]
    for f in sorted({c["load"] for c in cells}):
        reps = sorted({c["rep"] for c in cells if c["load"] == f})
        by = {(c["rep"], c["policy"]): c for c in cells if c["load"] == f}
        ratio = spread([by[k, "eager"]["ttft_avg_ms"] / base[k]["eager"]["ttft_ms"] for k in reps])
        curves = spread([by[k, "eager_curves"]["ttft_avg_ms"] / base[k]["eager_curves"]["ttft_ms"] for k in reps])
        triton = [p for p in TRITON if all((k, p) in by for k in reps)]  # none under perf_analyzer
        best = min(triton, key=lambda p: sum(by[k, p]["ttft_avg_ms"] for k in reps)) if triton else None
        goal = (f"<= {GOAL:g}: " + judge_spread(ratio, GOAL, lower_is_better=True)
                if abs(f - GOAL_LOAD) < 1e-9 else "-")

        def mean(p: str, key: str) -> float:
            return statistics.fmean(by[k, p][key] for k in reps)

        if best is None:
            vs_cells = "- | - | - | - |"
        else:
            vs = spread([by[k, best]["ttft_avg_ms"] / by[k, "eager"]["ttft_avg_ms"] for k in reps])
            vs_cells = (f"{best.removeprefix('triton_')} | {mean(best, 'ttft_avg_ms'):.1f} / "
                        f"{mean(best, 'ttft_p99_ms'):.1f} | {mean(best, 'tpot_avg_ms'):.2f} | "
                        f"{fmt(vs)} ({verdict(vs, 1.0)} >= 1) |")
        lines.append(f"| {f:.0%} | {fmt(ratio)} | {goal} | {mean('eager', 'ttft_avg_ms'):.1f} / "
                     f"{mean('eager', 'ttft_p99_ms'):.1f} | {mean('eager', 'tpot_avg_ms'):.2f} | "
                     f"{fmt(curves)} | {mean('eager_curves', 'ttft_avg_ms'):.1f} / "
                     f"{mean('eager_curves', 'ttft_p99_ms'):.1f} | {mean('eager_curves', 'tpot_avg_ms'):.2f} | "
                     + vs_cells)
    lines.append(f"\nErrors: {sum(c['errors'] for c in cells)} of {sum(c['sent'] for c in cells)} requests.")
    return lines
