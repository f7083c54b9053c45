"""The mixed-SLA benchmark's goals and report, from its raw cells: what ``bench_mixed`` prints after a run and
``mixed_page`` renders from docs/data/."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


from benchmarks.harness import fmt, judge_spread, spread
from benchmarks.harness.page import table_head
from benchmarks.harness.plots import pyplot, save


# eager_seg4: the same rule on the model's stages merged into 4 segments (config fuse_segments: 4,
# lazybatch/repo.py VARIANT_POLICIES): boundaries only every quarter of a pass, each segment one onnxruntime call
POLICIES = {"eager": "eager:urgency=true", "eager_seg4": "eager:urgency=true", "triton_0us": "triton:0",
            "triton_5000us": "triton:5000", "triton_20000us": "triton:20000"}
OURS = ["eager", "eager_seg4"]

TRITON = [p for p in POLICIES if p.startswith("triton")]

# (name, share, SLA in multiples of t1, priority level): the goal's mix (docs/results/mixed.md)
MIX = [("interactive", 0.2, 2.0, 1), ("bulk", 0.8, 20.0, 2)]
GOALS = {"interactive_misses": 5.0, "bulk_throughput": 0.9, "bulk_misses": 1.1}


def _mean(cells: list[dict], pol: str, load: float, cls: str, key: str) -> float:
    v = [c["classes"][cls][key] for c in cells if c["policy"] == pol and c["load"] == load]
    return statistics.fmean(v) if v else math.nan


def _ratio(a: float, b: float) -> float:
    """a / b, with 0 / 0 a tie (1) and x / 0 infinite."""
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def ratios(m: dict, load: float, ours: str = "eager") -> dict:
    """Best Triton config at ``load`` (fewest interactive misses) and the goal ratios of ``ours`` per repetition."""
    cells = m["cells"]
    best = min(TRITON, key=lambda p: _mean(cells, p, load, "interactive", "sla_violation_rate"))
    per_rep = {"interactive_misses": [], "bulk_throughput": [], "bulk_misses": []}
    reps = sorted({c["rep"] for c in cells if c["load"] == load})
    for k in reps:
        e = next(c for c in cells if c["policy"] == ours and c["load"] == load and c["rep"] == k)["classes"]
        t = next(c for c in cells if c["policy"] == best and c["load"] == load and c["rep"] == k)["classes"]
        per_rep["interactive_misses"].append(_ratio(t["interactive"]["sla_violation_rate"],
                                                    e["interactive"]["sla_violation_rate"]))
        per_rep["bulk_throughput"].append(_ratio(e["bulk"]["throughput"], t["bulk"]["throughput"]))
        per_rep["bulk_misses"].append(_ratio(e["bulk"]["sla_violation_rate"], t["bulk"]["sla_violation_rate"]))
    return {"best": best, **{k: spread(v) for k, v in per_rep.items()}}


def _verdict(s: dict, goal: float, at_most: bool = False) -> str:
    """The one rule (harness.verdict) on the range over repetitions; ``at_most``: lower is better."""
    return judge_spread(s, goal, lower_is_better=at_most)


def _fmt(s: dict, none: str = "") -> str:
    """mean [min-max]; a ratio over a zero count is infinite (``none`` says whose count it was)."""
    if math.isinf(s["mean"]):
        return f"inf ({none} missed none)" if math.isinf(s["min"]) else f"inf [{s['min']:.2f}-inf] ({none} " \
                                                                         f"missed none in some repetitions)"
    return fmt(s)


def report(m: dict) -> list[str]:
    lines = [f"### {m['model']}: t1 {m['t1_ms']:.2f} ms; interactive SLA {m['classes'][0]['sla_ms']:.1f} ms, "
             f"bulk SLA {m['classes'][1]['sla_ms']:.1f} ms", "",
             *table_head(["load", "policy", "interactive misses", "interactive avg / p99 ms", "bulk misses",
                          "bulk avg ms", "bulk throughput /s", "errors"], compact=True)]
    cells = m["cells"]
    loads = sorted({c["load"] for c in cells})
    present = [p for p in POLICIES if any(c["policy"] == p for c in cells)]  # an older run may lack a variant
    for f in loads:
        for pol in present:
            mine = [c for c in cells if c["policy"] == pol and c["load"] == f]
            lines.append(
                f"| {f:.0%} | {pol} | {_mean(cells, pol, f, 'interactive', 'sla_violation_rate'):.1%} | "
                f"{_mean(cells, pol, f, 'interactive', 'avg_ms'):.1f} / "
                f"{_mean(cells, pol, f, 'interactive', 'p99_ms'):.1f} | "
                f"{_mean(cells, pol, f, 'bulk', 'sla_violation_rate'):.1%} | "
                f"{_mean(cells, pol, f, 'bulk', 'avg_ms'):.1f} | {_mean(cells, pol, f, 'bulk', 'throughput'):.1f} | "
                f"{sum(c['errors'] for c in mine)} |")
    lines += ["", *table_head(["load", "ours", "best Triton", "interactive misses, Triton / ours (goal >= 5)",
                               "bulk throughput, ours / Triton (>= 0.9)", "bulk misses, ours / Triton (<= 1.1)",
                               "simulated: interactive / bulk misses"], compact=True)]
    sim = m["simulated"]
    for f, ours in ((f, o) for f in loads for o in OURS if o in present):
        r = ratios(m, f, ours)
        scell = {c["policy"]: c["classes"] for c in sim["cells"] if c["load"] == f}
        sbest = min((p for p in scell if p not in OURS), key=lambda p: scell[p]["interactive"]["violations"])
        si = _ratio(scell[sbest]["interactive"]["violations"], scell[ours]["interactive"]["violations"])
        sb = _ratio(scell[ours]["bulk"]["violations"], scell[sbest]["bulk"]["violations"])
        lines.append(f"| {f:.0%} | {ours} | {r['best']} | {_fmt(r['interactive_misses'], ours)}: "
                     f"{_verdict(r['interactive_misses'], GOALS['interactive_misses'])} | "
                     f"{_fmt(r['bulk_throughput'])}: {_verdict(r['bulk_throughput'], GOALS['bulk_throughput'])} | "
                     f"{_fmt(r['bulk_misses'], 'Triton')}: {_verdict(r['bulk_misses'], GOALS['bulk_misses'], at_most=True)} | "
                     f"{si:.1f}x / {sb:.2f}x ({scell[ours]['interactive']['violations']:.1%} against "
                     f"{scell[sbest]['interactive']['violations']:.1%}) |")
    return lines


def plot(models: list[dict], path: Path) -> bool:
    """SLA misses per class against load; False (nothing drawn) where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
    for row, m in zip(axes, models):
        loads = sorted({c["load"] for c in m["cells"]})
        for pol in (p for p in POLICIES if any(c["policy"] == p for c in m["cells"])):
            style = dict(marker="o", linewidth=2.2) if pol in OURS else dict(marker="x", linestyle="--")
            for ax, cls in zip(row, ("interactive", "bulk")):
                ax.plot([100 * f for f in loads], [100 * _mean(m["cells"], pol, f, cls, "sla_violation_rate")
                                                   for f in loads], label=pol, **style)
        for ax, cls in zip(row, ("interactive", "bulk")):
            ax.set_title(f"{m['model']}: {cls} class")
            ax.set_xlabel("load (% of the batch-1 rate)")
            ax.set_ylabel("SLA misses (%)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=110)
    return True
