"""The co-location page's figures from the raw cells: means over repetitions, the goal ratios against the best
Triton configuration, repetition by repetition, of the lineup's own configuration (``ours``: the device scheduler or
the CPU share), of the lazybatch ones beside it and of the identical copy of Triton 0 ms (the noise floor), and their
verdicts by the one rule (benchmarks/harness/verdict.py).

"Best Triton" for a repetition is the Triton configuration (0/5/20 ms, 0 ms + rate limiter) with the best figure
over the *other* repetitions (harness.stats.held_out_ratios): picked on the repetition itself, the best of four noisy
figures is biased against the one it is compared with."""

from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable, Sequence

from benchmarks.colocation.repo import JUDGED, OURS, TRITON, TWIN
from benchmarks.harness.stats import held_out_ratios, spread
from benchmarks.harness.verdict import count, judge_spread

GOAL_LOADS = (0.7, 1.0, 1.2)  # "four models at 70-120% aggregate load"
# (goal name, at least this ratio): best Triton / lazybatch unless said
SWEEP_GOALS = {"aggregate avg": 2.0, "SLA violations": 3.0, "worst model avg": 0.95, "peak throughput": 1.2}
PAIR_GOALS = {"small avg": 2.0, "small p99": 3.0, "small avg / alone": 1.3, "large avg": 0.95}
PRIO_GOAL = 1.5  # urgent model's p99 together / alone, at most


def select(cells: Iterable[dict], **where: object) -> list[dict]:
    """The cells whose keys equal ``where`` (a float load compared with a tolerance)."""
    out = []
    for c in cells:
        ok = True
        for k, v in where.items():
            got = c.get(k)
            if isinstance(v, float) and isinstance(got, (int, float)):
                ok = abs(float(got) - v) < 1e-9
            else:
                ok = got == v
            if not ok:
                break
        if ok:
            out.append(c)
    return sorted(out, key=lambda c: c["rep"])


def mean(vals: Iterable[float]) -> float:
    v = [x for x in vals if x is not None and math.isfinite(x)]
    return statistics.fmean(v) if v else math.nan


def fig(cell: dict, who: str, key: str, sub: str | None = None) -> float:
    """A figure of a cell: ``who`` a model kind or "all"; ``sub``: the attainment's tightness."""
    d = cell["all"] if who == "all" else cell["models"].get(who, {})
    v = d.get(key, math.nan)
    if sub is not None:
        return v.get(sub, math.nan) if isinstance(v, dict) else math.nan
    return v


def per_rep(cells: list[dict], configs: Sequence[str], value: Callable[[dict], float]) -> dict[str, list[float]]:
    """config -> the figure per repetition (in repetition order; only repetitions every config has)."""
    reps = sorted(set.intersection(*[{c["rep"] for c in cells if c["config"] == k} for k in configs]) if configs
                  else set())
    by = {(c["config"], c["rep"]): c for c in cells}
    return {k: [value(by[k, r]) for r in reps] for k in configs}


def floored(v: float, floor: float) -> float:
    """A violation rate floored at one request of the cell, so that none against none reads 1x, not 0/0."""
    return max(v, floor) if math.isfinite(v) else v


def goal_ratios(cells: list[dict], kinds: Sequence[str], ours: str = OURS) -> dict[str, dict]:
    """Per goal of the four-model sweep at one (mix, load): best Triton / ours per repetition (throughput: ours /
    best), and the same with the identical copy in ours' place. The worst model is the lowest of the models' avg
    ratios within a repetition (each model against the same best-by-aggregate configuration)."""
    configs = [c for c in TRITON + list(JUDGED) if any(x["config"] == c for x in cells)]
    tri = [c for c in TRITON if c in configs]
    if ours not in configs or not tri:
        return {}
    floor = 1.0 / max(1, min(c["all"].get("sent", 0) for c in cells))
    out = {}
    for name, getter, higher in (
            ("aggregate avg", lambda c: fig(c, "all", "avg_ms"), False),
            ("SLA violations", lambda c: floored(fig(c, "all", "violations"), floor), False),
            ("peak throughput", lambda c: fig(c, "all", "throughput"), True)):
        vals = per_rep(cells, configs, getter)
        base = {k: ([1.0 / v for v in vals[k]] if higher else vals[k]) for k in tri}
        for who in JUDGED:
            if who not in vals:
                continue
            mine = [1.0 / v for v in vals[who]] if higher else vals[who]
            r, picks = held_out_ratios(base, mine)
            out.setdefault(name, {})[who] = {"ratios": r, "best": picks}
    # worst model: per repetition, min over models of best-Triton-by-aggregate avg / ours
    agg = per_rep(cells, configs, lambda c: fig(c, "all", "avg_ms"))
    for who in JUDGED:
        if who not in agg:
            continue
        _, picks = held_out_ratios({k: agg[k] for k in tri}, agg[who])
        reps = sorted({c["rep"] for c in cells if c["config"] == who})
        by = {(c["config"], c["rep"]): c for c in cells}
        r = [min(fig(by[p, k], m, "avg_ms") / fig(by[who, k], m, "avg_ms") for m in kinds)
             for k, p in zip(reps, picks)]
        out.setdefault("worst model avg", {})[who] = {"ratios": r, "best": picks}
    return out


def judged(ratios: Sequence[float], goal: float, *, lower_is_better: bool = False) -> tuple[dict | None, str]:
    """The spread of ``ratios`` and its verdict; (None, "-") without any."""
    r = [x for x in ratios if math.isfinite(x)]
    if not r:
        return None, "-"
    s = spread(r)
    return s, judge_spread(s, goal, lower_is_better=lower_is_better)


def sweep_verdicts(cells: list[dict], kinds: Sequence[str], driver: str = "load", ours: str = OURS) -> dict:
    """Per mix and goal: the verdict on each goal-load cell (ours and the twin), the per-cell counts, and the pooled
    spread over every goal-load cell's repetitions with its verdict. Peak throughput is judged once per mix: each
    configuration's highest aggregate throughput over the loads, repetition by repetition."""
    out: dict = {}
    sweep = [c for c in cells if c["exp"] == "sweep" and c["driver"] == driver and c.get("alone") is None]
    for mix in sorted({c["mix"] for c in sweep}):
        loads = sorted({c["load"] for c in sweep if c["mix"] == mix})
        goal_loads = [f for f in loads if any(abs(f - g) < 1e-9 for g in GOAL_LOADS)]
        per_goal: dict = {g: {"cells": [], "pooled": {w: [] for w in JUDGED}} for g in SWEEP_GOALS}
        for f in goal_loads:
            r = goal_ratios(select(sweep, mix=mix, load=f), kinds, ours)
            for g, who_r in r.items():
                if g == "peak throughput":
                    continue
                row = {"load": f}
                for who, d in who_r.items():
                    s, v = judged(d["ratios"], SWEEP_GOALS[g])
                    row[who] = {"spread": s, "verdict": v, "best": d["best"]}
                    per_goal[g]["pooled"][who] += d["ratios"]
                per_goal[g]["cells"].append(row)
        # peak throughput: the highest aggregate throughput over the loads, per repetition
        peak_cells = []
        for k in sorted({c["rep"] for c in sweep if c["mix"] == mix}):
            for cfg in {c["config"] for c in sweep}:
                mine = [c for c in sweep if c["mix"] == mix and c["rep"] == k and c["config"] == cfg]
                if mine:
                    best = max(mine, key=lambda c: fig(c, "all", "throughput"))
                    peak_cells.append({**best, "load": -1.0})
        r = goal_ratios(peak_cells, kinds, ours).get("peak throughput", {})
        for who, d in r.items():
            per_goal["peak throughput"]["pooled"][who] = d["ratios"]
        for g, d in per_goal.items():
            for who in JUDGED:
                s, v = judged(d["pooled"][who], SWEEP_GOALS[g])
                d[f"{who}_pooled"] = {"spread": s, "verdict": v}
            d["counts"] = {who: count(row[who]["verdict"] for row in d["cells"] if who in row and
                                      row[who]["verdict"] != "-") for who in JUDGED}
        out[mix] = per_goal
    return out


def pair_figures(cells: list[dict], small: str, large: str, ours: str = OURS) -> dict:
    """The pair's goals, repetition by repetition: best Triton (by the small model's avg, held out) / ours for the
    small model's avg and p99 and the large model's avg (against the same configuration), and ours together / ours
    alone (the small model's avg, its own arrivals alone under lazybatch); the twin in ours' place beside."""
    pair = [c for c in cells if c["exp"] == "pair" and c.get("alone") is None]
    alone = {(c["config"], c["alone"], c["rep"]): c for c in cells if c["exp"] == "pair" and c.get("alone")}
    configs = [c for c in TRITON + list(JUDGED) if any(x["config"] == c for x in pair)]
    tri = [c for c in TRITON if c in configs]
    if ours not in configs or not tri:
        return {}
    avg = per_rep(pair, configs, lambda c: fig(c, small, "avg_ms"))
    reps = sorted({c["rep"] for c in pair if c["config"] == ours})
    by = {(c["config"], c["rep"]): c for c in pair}
    out: dict = {}
    for who in JUDGED:
        if who not in avg:
            continue
        _, picks = held_out_ratios({k: avg[k] for k in tri}, avg[who])
        rs = {"small avg": [], "small p99": [], "large avg": [], "small avg / alone": []}
        for k, p in zip(reps, picks):
            o, t = by[who, k], by[p, k]
            rs["small avg"].append(fig(t, small, "avg_ms") / fig(o, small, "avg_ms"))
            rs["small p99"].append(fig(t, small, "p99_ms") / fig(o, small, "p99_ms"))
            rs["large avg"].append(fig(t, large, "avg_ms") / fig(o, large, "avg_ms"))
            a = alone.get(("triton_0us" if who == TWIN else ours, small, k))  # every lazybatch one: ours alone
            if a is not None:
                rs["small avg / alone"].append(fig(o, small, "avg_ms") / fig(a, small, "avg_ms"))
        out[who] = {"best": picks}
        for g, r in rs.items():
            s, v = judged(r, PAIR_GOALS[g], lower_is_better=g.endswith("alone"))
            out[who][g] = {"spread": s, "verdict": v}
    return out


def prio_figures(cells: list[dict], urgent: str) -> dict:
    """The urgent model's p99 together / its p99 alone (the same arrivals, the same configuration), per
    configuration and repetition; the goal (at most 1.5) judged for the lineup's own, the others shown beside."""
    prio = [c for c in cells if c["exp"] == "prio"]
    out = {}
    for cfg in sorted({c["config"] for c in prio if c.get("alone") is None}):
        together = {c["rep"]: c for c in prio if c["config"] == cfg and c.get("alone") is None}
        alone = {c["rep"]: c for c in prio if c["config"] == cfg and c.get("alone") == urgent}
        r = [fig(together[k], urgent, "p99_ms") / fig(alone[k], urgent, "p99_ms") for k in sorted(together)
             if k in alone]
        s, v = judged(r, PRIO_GOAL, lower_is_better=True)
        out[cfg] = {"spread": s, "verdict": v}
    return out


def model_check(cells: list[dict], config: str, kinds: Sequence[str]) -> dict:
    """Served / simulated avg and p99 of ``config``'s load-driver cells (the processor-sharing and token models
    checked against served figures): per model and aggregate, the spread over every cell and repetition."""
    out = {}
    mine = [c for c in cells if c["config"] == config and c.get("sim") and c.get("alone") is None]
    for who in ["all", *kinds]:
        for key in ("avg_ms", "p99_ms"):
            r = [fig(c, who, key) / fig(c["sim"], who, key) for c in mine
                 if who == "all" or who in c["sim"].get("models", {})]
            r = [x for x in r if math.isfinite(x) and x > 0]
            if r:
                out[f"{who} {key.removesuffix('_ms')}"] = {
                    **spread(r), "geomean": math.exp(statistics.fmean(math.log(x) for x in r))}
    return out
