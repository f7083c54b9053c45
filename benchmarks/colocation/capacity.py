"""Co-location capacity, Heracles' question (ISCA 2015): how much best-effort traffic the machine carries while the
latency-critical model keeps its p99 within its SLA, per configuration of the pair.

    python -m benchmarks.pair --capacity --kinds small=tiny,large=mlp   # about 15 minutes on 2 cores

Method (fixed before the run):

- The latency-critical model (the pair's small one) runs at ``--small-load`` of its batch-1 rate in every window.
  Its SLA is fixed before any search, in the same run: ``SLA_MULTIPLE`` x its p99 alone under Triton 0 ms at that
  rate (over at least ``MIN_P99_REQUESTS`` requests): neither so tight that nothing meets it nor so loose that
  everything does.
- Per configuration, the best-effort model's rate is searched (client/capacity.py, what ``lazybatch load --capacity
  --beside`` runs): a window passes where both models were sustained (each window's second half's median latency at
  most 1.2x its first's, at least 98% answered, the client sending at least 95% of the schedule) and the
  latency-critical p99 is within the SLA. The capacity is the highest rate that passed.
- The configurations' searches take turns window by window (each repetition in a turned order), so the machine's
  drift lands on all alike. ``alone`` is the best-effort model under Triton 0 ms with nothing beside it, judged on
  being sustained only: the ceiling is its capacity less what the latency-critical model uses (its rate x t1).
- The noise floor: an identical copy of Triton 0 ms (TWIN) searched like the others; its capacity / Triton 0 ms's is
  what one repetition's ratio can be for a configuration identical to the baseline. Where its range leaves
  0.90-1.10 the ratios have no verdict (run longer windows).

A search's resolution: after ``steps`` bisections between a pass and a failure a factor of 2 apart, 2^-steps of the
rate (3% at 5 steps).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from benchmarks.colocation.pair import PAUSE_S
from benchmarks.harness.measure import service_time
from benchmarks.harness.plots import pyplot, save
from benchmarks.harness.procs import niced, processes
from benchmarks.harness.stats import fmt, spread
from benchmarks.harness.verdict import judge
from lazybatch.client.api import Client
from lazybatch.client.capacity import MIN_REQUESTS, CapacitySearch
from lazybatch.client.load import run_load
from lazybatch.client.together import run_at_rates

SLA_MULTIPLE = 3.0  # the latency-critical SLA: this x its p99 alone under Triton 0 ms at its rate
MIN_P99_REQUESTS = 1000  # the requests that p99 alone rests on
ALONE = "alone"  # the best-effort model alone under Triton 0 ms: the ceiling's search
GOAL = 2.0  # lazybatch's capacity / Triton 0 ms's (docs/colocation.md, "Capacity beside a latency-critical model")
FLOOR = (0.90, 1.10)  # the noise floor's range that lets the ratios have a verdict
BASE = "triton_0us"


def turn(order: Sequence[str], k: int) -> list[str]:
    """Repetition ``k``'s order: the configurations turned by ``k``."""
    k %= len(order)
    return [*order[k:], *order[:k]]


def fixed_sla(p99_alone_ms: float) -> float:
    """The latency-critical SLA, fixed before any search."""
    return SLA_MULTIPLE * p99_alone_ms


def measure(url: str, names: Mapping[tuple[str, str], str], configs: Sequence[str], *, small_load: float = 0.3,
            start_load: float = 0.3, window_s: float = 5.0, steps: int = 5, reps: int = 3, seed: int = 0,
            pause_s: float = PAUSE_S, server_pid: int | None = None, hand: tuple[str, int] | None = None,
            progress: Callable[[str], None] = print) -> dict:
    """The searches on the server at ``url`` (gRPC); returns the raw data (``score`` and ``markdown`` read it).
    ``names``: (role, config) -> model name for roles small and large, configs ``configs`` (the first lazybatch's)
    and BASE; ``hand``: (config, nice) of the hand-set nice line, whose names are BASE's models: its large stub is
    held at that nice from outside for its windows. ``start_load``: the searches' first rate, a fraction of the
    large model's batch-1 rate, and no lower than a rate whose window holds MIN_REQUESTS answers (with 15% to
    spare), which is also the lowest searched."""
    began = time.monotonic()
    with Client(url) as c:
        t1_s = {role: service_time(c, names[(role, BASE)], n) for role, n in (("small", 200), ("large", 60))}
    lc_rate = small_load / t1_s["small"]
    be_rate1 = 1.0 / t1_s["large"]
    alone_s = max(window_s, MIN_P99_REQUESTS / lc_rate * 1.05)
    alone = run_load(url, names[("small", BASE)], lc_rate, alone_s, sla_ms=None, seed=seed + 999, timeout_s=60.0)
    sla = fixed_sla(alone.p99_ms)
    progress(f"capacity: t1 small {t1_s['small'] * 1e3:.2f} ms, large {t1_s['large'] * 1e3:.2f} ms; small at "
             f"{lc_rate:.1f}/s; its p99 alone {alone.p99_ms:.2f} ms over {alone.ok} requests -> SLA {sla:.2f} ms")
    # no lower than a rate whose window holds the answers a verdict needs (client/capacity.py MIN_REQUESTS)
    floor_rate = MIN_REQUESTS * 1.15 / window_s
    start = start_load * be_rate1
    order = [*configs, ALONE]
    searches: list[dict] = []
    for k in range(reps):
        live = {cfg: CapacitySearch(sla_ms=sla if cfg != ALONE else math.inf, start_rate=max(start, floor_rate),
                                    steps=steps, min_rate=floor_rate) for cfg in order}
        w = 0
        while True:
            due = [(cfg, live[cfg].next_rate()) for cfg in turn(order, k)]
            due = [(cfg, r) for cfg, r in due if r is not None]
            if not due:
                break
            for cfg, rate in due:
                lowered = niced([processes(server_pid)[names[("large", cfg)]]], hand[1]) \
                    if hand and cfg == hand[0] and server_pid is not None else contextlib.nullcontext()
                seed_w = seed + 1000 * k + w
                with lowered:
                    if cfg == ALONE:
                        be = run_load(url, names[("large", BASE)], rate, window_s, sla_ms=None, seed=seed_w,
                                      timeout_s=60.0)
                        probe = live[cfg].record(rate, be)
                    else:
                        lc_name, be_name = names[("small", cfg)], names[("large", cfg)]
                        lc, be = run_at_rates(url, {lc_name: lc_rate, be_name: rate}, window_s, seed=seed_w,
                                              sla_ms={lc_name: sla, be_name: None}, send_sla=cfg == configs[0],
                                              timeout_s=60.0)
                        probe = live[cfg].record(rate, be, guarded=lc)
                progress(f"  rep {k} {cfg:<18} large at {rate:7.1f}/s: {'pass' if probe.passed else 'fail'} "
                         f"({probe.why})")
                time.sleep(pause_s)
            w += 1
        for cfg, s in live.items():
            best = s.best
            searches.append({"rep": k, "config": cfg, "capacity": best.rate if best else 0.0,
                             "throughput": best.throughput if best else 0.0,
                             "probes": [vars(p) for p in s.probes]})
    return {"meta": {"configs": list(configs), "t1_ms": {r: v * 1e3 for r, v in t1_s.items()},
                     "small_rate": lc_rate, "small_load": small_load, "sla_ms": sla, "sla_multiple": SLA_MULTIPLE,
                     "p99_alone_ms": alone.p99_ms, "p99_alone_requests": alone.ok, "window_s": window_s,
                     "steps": steps, "reps": reps, "seed": seed, "start_load": start_load, "min_rate": floor_rate,
                     "hand": list(hand) if hand else None, "names": {f"{r} {c}": n for (r, c), n in names.items()},
                     "elapsed_s": round(time.monotonic() - began, 1),
                     "loadavg": " ".join(f"{v:.1f}" for v in os.getloadavg())},
            "searches": searches}


def capacities(data: dict, config: str) -> list[float]:
    """One configuration's capacity per repetition, in repetition order."""
    rows = sorted((s for s in data["searches"] if s["config"] == config), key=lambda s: s["rep"])
    return [s["capacity"] for s in rows]


def _ratios(caps: Sequence[float], base: Sequence[float]) -> list[float]:
    """Per repetition, a capacity / Triton 0 ms's; left out where Triton 0 ms passed no rate (nothing to divide by)."""
    return [c / b for c, b in zip(caps, base) if b > 0]


def score(data: dict, twin: str) -> list[dict]:
    """Per configuration: its capacity per repetition, / BASE's in the same repetition (where BASE passed a rate),
    / the ceiling, the machine used at capacity (rate x t1 summed over both models), and for lazybatch's the verdict
    against GOAL and 1.00, given only where the noise floor (``twin``'s ratio) stayed within FLOOR in every
    repetition."""
    meta = data["meta"]
    t1 = {r: v / 1e3 for r, v in meta["t1_ms"].items()}
    lc_use = meta["small_rate"] * t1["small"]
    base = capacities(data, BASE)
    ceiling = [max(a * (1.0 - lc_use), 0.0) for a in capacities(data, ALONE)]
    twin_caps = capacities(data, twin) if twin in meta["configs"] else []
    floor = _ratios(twin_caps, base)
    rows = []
    for cfg in [*meta["configs"], ALONE]:
        caps = capacities(data, cfg)
        ratio = _ratios(caps, base)
        row = {"config": cfg, "capacity": spread(caps), "vs_base": spread(ratio) if ratio else None,
               "used": spread([lc_use + c * t1["large"] for c in caps] if cfg != ALONE else
                              [c * t1["large"] for c in caps]),
               "vs_ceiling": spread([c / m for c, m in zip(caps, ceiling) if m > 0] or [math.nan])}
        if cfg == meta["configs"][0]:
            lost = len(base) - len(floor)
            if not twin_caps:
                row["verdict"] = "no verdict: no noise floor"
            elif lost:
                row["verdict"] = (f"no verdict: Triton 0 ms passed no rate in {lost} of {len(base)} repetitions "
                                  f"(below the lowest rate a window judges: longer windows)")
            elif not all(FLOOR[0] <= f <= FLOOR[1] for f in floor):
                row["verdict"] = (f"no verdict: the noise floor read {fmt(spread(floor))}, outside "
                                  f"{FLOOR[0]:.2f}-{FLOOR[1]:.2f} (longer windows)")
            else:
                row["verdict"] = (f"{judge(min(ratio), max(ratio), GOAL)} at the {GOAL:g}x goal; "
                                  f"{judge(min(ratio), max(ratio), 1.0)} against 1.00")
        rows.append(row)
    return rows


def markdown(data: dict, twin: str, labels: Mapping[str, str]) -> str:
    """The page's body: the method in one paragraph, the table, the verdict line."""
    meta = data["meta"]
    names = meta["names"]
    lines = [f"The latency-critical model `{names[f'small {BASE}'].rsplit('_', 2)[0]}` at {meta['small_rate']:.1f}/s "
             f"({meta['small_load']:.0%} of its batch-1 rate, t1 {meta['t1_ms']['small']:.2f} ms), its SLA fixed "
             f"before the searches at {meta['sla_multiple']:g} x its p99 alone under Triton 0 ms = "
             f"{meta['sla_ms']:.2f} ms (p99 alone {meta['p99_alone_ms']:.2f} ms over "
             f"{meta['p99_alone_requests']:,} requests); the best-effort model "
             f"`{names[f'large {BASE}'].rsplit('_', 2)[0]}` (t1 {meta['t1_ms']['large']:.2f} ms) searched per "
             f"configuration in windows of {meta['window_s']:g} s, {meta['steps']} bisections, {meta['reps']} "
             f"repetitions taking turns window by window. Capacity: the highest best-effort rate at which both "
             f"models were sustained and the latency-critical p99 stayed within the SLA. Machine used: the sum over "
             f"both models of rate x t1 alone (1.00 = the whole machine busy at batch 1). Ceiling: the best-effort "
             f"model's capacity alone less the latency-critical model's use.", "",
             "| configuration | best-effort capacity /s | / Triton 0 ms | / ceiling | machine used at capacity | "
             "verdict |", "| --- | --- | --- | --- | --- | --- |"]
    for row in score(data, twin):
        cfg = row["config"]
        vs = fmt(row["vs_base"]) if row["vs_base"] else "-"
        lines.append(f"| {labels.get(cfg, cfg)} | {fmt(row['capacity'], 1)} | {vs} | "
                     f"{fmt(row['vs_ceiling'])} | {fmt(row['used'])} | {row.get('verdict', '')} |")
    lines += ["", "Ranges are mean [min-max] over the repetitions; a range across a goal is a tie. The identical "
              "copy's row is the noise floor: its ratio to Triton 0 ms is what chance gives a configuration "
              "identical to it. / Triton 0 ms: over the repetitions in which Triton 0 ms passed a rate ('-': "
              "none). A capacity of 0: no rate passed down to the lowest a window can judge "
              f"({meta.get('min_rate', math.nan):.1f}/s: {MIN_REQUESTS} answers in a window)."]
    return "\n".join(lines)


def plot(data: dict, path: Path, labels: Mapping[str, str]) -> Path:
    """Every window of every search: the best-effort rate against the latency-critical p99, passes filled,
    failures hollow, the SLA as a line: where each configuration's searches crossed it."""
    plt = pyplot()
    if plt is None:
        raise RuntimeError("the plot needs matplotlib: pip install -e '.[plots]'")
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, cfg in enumerate(data["meta"]["configs"]):
        probes = [p for s in data["searches"] if s["config"] == cfg for p in s["probes"]]
        label = labels.get(cfg, cfg)  # on its first series: a configuration that never passed is named too
        for passed in (True, False):
            pts = [(p["rate"], p["p99_ms"]) for p in probes if p["passed"] == passed and not math.isnan(p["p99_ms"])]
            if pts:
                ax.scatter(*zip(*pts), s=18, color=f"C{i}", facecolors=f"C{i}" if passed else "none", label=label)
                label = None
    ax.axhline(data["meta"]["sla_ms"], color="k", lw=0.8, ls="--", label="latency-critical SLA")
    ax.set_xlabel("best-effort rate (requests/s)")
    ax.set_ylabel("latency-critical p99 (ms)")
    ax.set_title("filled: the window passed; hollow: it failed", fontsize=8)
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path, dpi=110)


LABELS = {"eager_shared": "lazybatch default (eager, CPU share)", "triton_0us": "Triton 0 ms",
          "triton_5000us": "Triton 5 ms", "triton_0us_twin": "noise floor: identical copy of Triton 0 ms",
          "triton_0us_pinned": "Triton 0 ms, pinned (host policies)",
          "hand_nice": "Triton 0 ms, large stub at nice 10 by hand (reference)",
          ALONE: "best-effort model alone (Triton 0 ms; no SLA to keep)"}
TWIN = "triton_0us_twin"


def page(data: dict, path: Path, *, json_path: Path) -> str:
    """The results page at ``path``, its plot beside it (an img/ folder next to a docs/results page); returns it."""
    meta = data["meta"]
    kinds = meta.get("kinds", {})
    img_dir = path.parent.parent / "img" if path.parent.name == "results" else path.parent
    img = plot(data, img_dir / f"colocation_capacity_{kinds.get('small', 'small')}_{kinds.get('large', 'large')}.png",
               LABELS)
    rel = lambda p: os.path.relpath(p, path.parent)  # noqa: E731
    text = "\n".join([
        "# Co-location capacity: best-effort traffic while a latency-critical model keeps its SLA", "",
        f"Generated by `{meta.get('command', 'python -m benchmarks.pair --capacity')}` at commit "
        f"`{meta.get('commit', '?')}`, {meta.get('date', '')}; {meta.get('cpu', '')}. Raw data: "
        f"[{json_path.name}]({rel(json_path)}); method: benchmarks/colocation/capacity.py; design in "
        "[colocation.md](../colocation.md).", "",
        markdown(data, TWIN, LABELS), "",
        f"![latency-critical p99 against the best-effort rate, every window of every search]({rel(img)})", ""])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text
