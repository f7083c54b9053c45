"""The quickstart's verdicts and page from its raw windows: what ``python -m benchmarks.quickstart`` prints after a
run and renders again from its data (``--from-data``). How it measures: benchmarks/quickstart.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.colocation.pair import TWIN
from benchmarks.harness import geomean, judge
from benchmarks.harness.measure import pool_load
from benchmarks.harness.method import floor_settled, floor_verdict, p99_note
from benchmarks.harness.page import table_head
from benchmarks.harness.plots import latency_cdfs
from lazybatch.batcher.cpu_rank import NICE_STEPS
from lazybatch.shipped import KIND_SLA_MS, PAIR_OURS

CONFIGS = {"lazybatch": PAIR_OURS, "Triton 0 ms": "triton_0us", "copy": TWIN}  # name -> model suffix
HAND = "hand-set nice"  # Triton 0 ms's models, the neighbour's stub at HAND_NICE for the window
HAND_NICE = NICE_STEPS[1]  # the CPU share's first step
LOADS = (0.4, 0.7)  # question 1: fractions of the MLP's batch-1 rate
ALONE_SLA_MS = KIND_SLA_MS["mlp"]  # question 1's SLA: its violations and goodput
# question 2: the latency-critical model (small), its busy neighbour (large) and their fractions of their own batch-1
# rates: why not the MLP beside ResNet-50, docs/colocation.md "The quickstart's pair"
PAIR = {"small": "tiny", "large": "mlp"}
SMALL_LOAD, LARGE_LOAD = 0.3, 0.5
SEGMENT_S, WINDOW_S, REPS = 2.0, 2.0, 3
SEGMENTS, ALONE_SEGMENTS = 3, 2  # question 2's windows per configuration and repetition: together, and alone
GOALS = {"avg": 1.2, "p99": 1.5}  # the small model beside the large one / alone, under lazybatch (docs/colocation.md)
LABEL = {"mlp": "the MLP", "resnet50": "ResNet-50", "tiny": "tiny", "bert": "BERT", "mobilenet": "MobileNet"}
LATER = ["python -m benchmarks.bench_default   # the standing guard: four models, both load generators, settled",
         "python -m benchmarks.pair            # the pair beside Triton 5 ms and pinning (host policies)",
         "python -m benchmarks.pair --capacity --kinds small=tiny,large=mlp   # best-effort capacity under an SLA",
         "lazybatch load MODEL --capacity --rate 5 --sla-ms 200            # one model's capacity under its SLA"]


IN_WINDOW = 0.95  # answers inside their window / sends at least this, or the window cannot call the cell sustained


def cell(runs: list[dict], sla_ms: float, **key: object) -> dict:
    """The pooled figures of the runs matching ``key`` (harness.measure.pool_load), with per-repetition averages
    and the steal the windows saw. Sustained also needs IN_WINDOW of the requests answered before their window
    ended: a steady queue answers all but rate x its average latency of them (Little's law), so this asks for an
    average under 5% of the window; a longer one a window this short cannot tell from a queue growing through it."""
    mine = [r for r in runs if all(r.get(k) == v for k, v in key.items())]
    c = pool_load(mine, sla_ms)
    reps = sorted({r["rep"] for r in mine})
    c["rep_avg"] = [float(np.mean([v for r in mine if r["rep"] == k for v in r["latencies"]] or [math.nan]))
                    for k in reps]
    c["steal"] = max((r["steal"] for r in mine), default=math.nan)
    c["busy"] = float(np.mean([r["busy"] for r in mine])) if mine else math.nan
    span = sum(r["duration"] for r in mine)
    c["goodput"] = sum(1 for r in mine for v in r["latencies"] if v <= sla_ms) / span if span else math.nan
    inside = sum(1 for r in mine for t, lat, ok in r["records"] if ok and t + lat / 1e3 <= r["duration"])
    c["in_window"] = inside / max(c["sent"], 1)
    c["sustained"] = c["sustained"] and c["in_window"] >= IN_WINDOW
    return c


def ratio(base: dict, other: dict) -> dict:
    """base / other per repetition (average latency: above 1.00 ``other`` is faster): geomean, range, p99s pooled."""
    per = [b / o for b, o in zip(base["rep_avg"], other["rep_avg"]) if o > 0 and math.isfinite(b / o)]
    geo, lo, hi = geomean(per) if per else math.nan, min(per, default=math.nan), max(per, default=math.nan)
    return {"per_rep": per, "geo": geo, "lo": lo, "hi": hi, "p99": base["p99_ms"] / other["p99_ms"],
            "text": f"{geo:.2f}x [{lo:.2f}-{hi:.2f}]"}


def both(a: dict, b: dict) -> dict:
    """Two identical copies as one baseline, their figures averaged: against one copy, a policy equal to the other
    came out "behind" (a run at 40%: Triton 0 ms / lazybatch 0.90x, / its copy 0.91x; identical sessions run a few
    percent apart, and a server keeps the ones it drew)."""
    return {"rep_avg": [(x + y) / 2 for x, y in zip(a["rep_avg"], b["rep_avg"])],
            "p99_ms": (a["p99_ms"] + b["p99_ms"]) / 2}


def said(r: dict, goal: float = 1.0, *, lower_is_better: bool = False) -> str:
    v = judge(r["lo"], r["hi"], goal, lower_is_better=lower_is_better)
    return {"met": "ahead" if goal == 1.0 else "met", "missed": "behind" if goal == 1.0 else "missed"}.get(v, "tie")


def latency(c: dict) -> str:
    """A cell's latency, or why it has none: a cell that is not sustained shows throughput and goodput."""
    if not c["sustained"]:
        return (f"not sustained (drift {c['drift']:.2f}x, {c['in_window']:.0%} answered in the window) | "
                f"throughput {c['throughput']:.1f}/s, goodput {c['goodput']:.1f}/s")
    return f"{c['avg_ms']:.1f} | {c['p99_ms']:.1f}"


def first_table(runs: list[dict], t1_ms: float) -> list[str]:
    lines = [f"**1. Is the default level with Triton's batcher on a model alone?** The MLP (t1 {t1_ms:.1f} ms) "
             "alone. Ratio: the average of Triton 0 ms and its identical copy / lazybatch's, per repetition (above "
             "1.00 lazybatch is faster); noise floor: Triton 0 ms / its copy.", "",
             *table_head(["load", "configuration", "requests", "avg ms", "p99 ms", "drift", "max steal"])]
    verdicts = ["", *table_head(["load", "Triton 0 ms and its copy / lazybatch, avg", "noise floor", "verdict",
                                 "p99 ratio (noise floor)"])]
    for f in LOADS:
        cells = {name: cell(runs, ALONE_SLA_MS, question=1, load=f, config=name) for name in CONFIGS}
        for name, c in cells.items():
            lines.append(f"| {f:.0%} | {name} | {p99_note(c['requests'])} | {latency(c)} | {c['drift']:.2f} | "
                         f"{c['steal']:.1%} |")
        tri = both(cells["Triton 0 ms"], cells["copy"])
        ours, floor = ratio(tri, cells["lazybatch"]), ratio(cells["Triton 0 ms"], cells["copy"])
        if not all(c["sustained"] for c in cells.values()):
            verdict = "no verdict: not every configuration sustained this load"
        else:
            word = said(ours)
            verdict = floor_verdict(ours["per_rep"], floor["per_rep"], word != "tie") or \
                (f"lazybatch {word}" if word != "tie" else "level (a tie)")
        verdicts.append(f"| {f:.0%} | {ours['text']} | {floor['text']} | {verdict} | {ours['p99']:.2f}x "
                        f"({floor['p99']:.2f}x) |")
    return lines + verdicts


def second_table(runs: list[dict], meta: dict) -> list[str]:
    slas, t1, kinds = meta["slas_ms"], meta["t1_ms"], meta["pair"]
    small, large = (LABEL.get(kinds[r], kinds[r]) for r in ("small", "large"))
    together = [c for c in [*CONFIGS, HAND] if any(r.get("mode") == "together" and r["config"] == c for r in runs)]
    offered = sum(meta["rates"][r] * t1[r] / 1e3 for r in kinds)
    cells = {(mode, cfg, role): cell(runs, slas[role], question=2, mode=mode, config=cfg, role=role)
             for mode in ("together", "alone") for cfg in together for role in kinds
             if any(r.get("mode") == mode and r["config"] == cfg and r["role"] == role for r in runs)}
    busy = np.nanmean([c["busy"] for (mode, _, _), c in cells.items() if mode == "together"])
    lines = [f"**2. What does a latency-critical model keep beside a busy neighbour?** {small} (t1 "
             f"{t1['small']:.1f} ms, SLA {slas['small']:g} ms) at {meta['loads']['small']:.0%} of its batch-1 rate "
             f"({meta['rates']['small']:.0f}/s) beside {large} (t1 {t1['large']:.1f} ms) at "
             f"{meta['loads']['large']:.0%} of its own ({meta['rates']['large']:.0f}/s), both at once: offered "
             f"{offered:.0%} of the machine (rate x t1 summed), /proc/stat busy {busy:.0%}.", "",
             *table_head(["configuration", f"{small}: requests", "avg ms", "p99 ms", f"{large}: requests", "avg ms",
                          "p99 ms", f"sustained (drift {small}, {large})", "max steal"])]
    for (mode, cfg, role), c in cells.items():
        if role != "small":
            continue
        big = cells.get((mode, cfg, "large"))
        label = f"{cfg}{', ' + str(HAND_NICE) + ' by hand' if cfg == HAND else ''}" if mode == "together" else \
            f"{small} alone, {cfg}"
        other = f"{p99_note(big['requests'])} | {latency(big)}" if big else "- | - | -"
        steady = all(x["sustained"] for x in (c, big) if x)
        lines.append(f"| {label} | {p99_note(c['requests'])} | {latency(c)} | {other} | "
                     f"{'yes' if steady else 'no'} ({c['drift']:.2f}, {big['drift'] if big else math.nan:.2f}) | "
                     f"{max(c['steal'], big['steal'] if big else 0):.1%} |")

    def get(mode: str, cfg: str, role: str = "small") -> dict | None:
        return cells.get((mode, cfg, role))

    def unsustained(*turns: tuple[str, str]) -> str:
        """'' where every model of these turns sustained its load, else which did not."""
        bad = [f"{cfg}{' alone' if mode == 'alone' else ''} ({name})" for mode, cfg in turns
               for role, name in (("small", small), ("large", large))
               if (c := get(mode, cfg, role)) is not None and not c["sustained"]]
        return f"no verdict: not sustained under {', '.join(bad)}" if bad else ""

    def row(figure: str, r: dict, goal: str, verdict: str) -> str:
        return f"| {figure} | {r['text']} | {r['p99']:.2f}x | {goal} | {verdict} |"

    lines += ["", *table_head(["figure", "ratio [range over repetitions]", "p99 ratio (pooled)", "goal", "verdict"])]
    for cfg in ("lazybatch", "Triton 0 ms"):  # beside / alone: lower is better
        if get("alone", cfg) and get("together", cfg):
            r = ratio(get("together", cfg), get("alone", cfg))
            lines.append(row(f"{small} beside {large} / alone, {cfg}", r,
                             f"avg <= {GOALS['avg']:g}x, p99 <= {GOALS['p99']:g}x",
                             unsustained(("alone", cfg), ("together", cfg)) or
                             f"avg {said(r, GOALS['avg'], lower_is_better=True)}, "
                             f"p99 {'met' if r['p99'] <= GOALS['p99'] else 'missed'}"))
    floors = {role: ratio(get("together", "Triton 0 ms", role), get("together", "copy", role))
              for role in kinds if get("together", "copy", role) and get("together", "Triton 0 ms", role)}
    for role, name in (("small", small), ("large", large)):
        if role in floors:
            lines.append(row(f"noise floor, {name}: Triton 0 ms / its identical copy", floors[role], "0.90-1.10x",
                             "settled" if floor_settled(floors[role]["per_rep"]) else "not settled"))
    for other in ("Triton 0 ms", HAND):  # Triton 0 ms, and the hand-set line, against lazybatch on both models
        for role, name in (("small", small), ("large", large)):
            theirs, mine = get("together", other, role), get("together", "lazybatch", role)
            if theirs is None or mine is None or role not in floors:
                continue
            why = unsustained(("together", other), ("together", "lazybatch"), ("together", "copy"))
            base = both(theirs, get("together", "copy", role)) if other == "Triton 0 ms" else theirs
            r, floor = ratio(base, mine), floors[role]["per_rep"]
            verdict = why or floor_verdict(r["per_rep"], floor, said(r) != "tie") or said(r)
            who = "Triton 0 ms and its copy" if other == "Triton 0 ms" else other
            if why and not (theirs["sustained"] and mine["sustained"]):  # what each carried, not a latency
                lines.append(f"| {name} beside {small if role == 'large' else large}, {who} / lazybatch | "
                             f"throughput {theirs['throughput']:.1f} / {mine['throughput']:.1f}/s, goodput "
                             f"{theirs['goodput']:.1f} / {mine['goodput']:.1f}/s | - | - | {verdict} |")
            else:
                goal = ">= 1.00x" if other == "Triton 0 ms" and role == "small" else "-"
                lines.append(row(f"{name} beside {small if role == 'large' else large}, {who} / lazybatch", r,
                                 goal, verdict))
    return lines


def cdf(runs: list[dict], kinds: dict[str, str], path: Path) -> Path | None:
    """The latency-critical model's latency CDF beside its neighbour per configuration, and alone (dashed)."""
    small, large = (LABEL.get(kinds[r], kinds[r]) for r in ("small", "large"))
    colours = dict(zip([*CONFIGS, HAND], ("tab:blue", "tab:orange", "tab:gray", "tab:green")))
    series = {f"{cfg}, {f'beside {large}' if mode == 'together' else 'alone'}": (
        [v for r in runs if r["question"] == 2 and r.get("mode") == mode and r["config"] == cfg and r["role"] ==
         "small" for v in r["latencies"]],
        {"color": colours[cfg], "linestyle": "--" if mode == "alone" else "-",
         "linewidth": 1 if cfg == "copy" else 1.8})
        for mode in ("together", "alone") for cfg in colours}
    return latency_cdfs(series, path, xlabel=f"{small} latency (ms, log scale)",
                        title=f"The latency-critical {small} beside {large}, and alone")


def render(data: dict, plot_path: Path, link: str | None = None) -> list[str]:
    """The tables from the raw data (``quickstart.json``) and the CDF plot written to ``plot_path`` (a page embeds it
    by ``link``)."""
    meta, runs = data["meta"], data["runs"]
    tables = [*first_table(runs, meta["alone_t1_ms"]), "", *second_table(runs, meta), ""]
    plot = cdf(runs, meta["pair"], plot_path)
    lines = [f"Measured at commit {meta.get('commit', '?')} on {meta.get('cpu', '?')} ({meta.get('cores')} cores): "
             + ", ".join(f"{k} {v:.0f} s" for k, v in meta["phases_s"].items()) + ".", "", *tables]
    if plot is not None:
        lines += [f"![the latency-critical model's latency CDF]({link})" if link else
                  f"The latency-critical model's latency CDF: {plot}", ""]
    return lines + ["Longer runs, each a command of its own:", "", "```", *LATER, "```"]
