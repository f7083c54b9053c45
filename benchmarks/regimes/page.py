"""The results page: a header naming the run (command, commit, machine), a summary, and one section per model with
its tables, verdicts and plots."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from benchmarks.regimes.plots import plot_model, plot_scaling
from benchmarks.regimes.policies import ALL_POLICIES, NOT_SERVED, ROW_ORDER, SEQ2SEQ_KINDS, Settings, VARIANTS
from benchmarks.regimes.replay import regime_of
from benchmarks.regimes.verdicts import (default_vs_best, fmt, goals, max_rate, min_rate, simulated_goals,
                                        simulated_table, why)
from benchmarks.harness.page import table_head


def driver_notes(res: dict) -> list[str]:
    """Where lazybatch load and perf_analyzer disagree, in numbers."""
    by = {(c["policy"], c["load"]): c for c in res["cells"]}
    out = []
    for pc in res["perf"]:
        c = by.get((pc["policy"], pc["load"]))
        if pc.get("error") or c is None or "avg_ms" not in pc:
            continue
        out.append((pc["server_requests"] / pc["wall_s"] / pc["rate"] if pc["wall_s"] else math.nan,
                    pc["avg_ms"] / c["avg_ms"] if c["avg_ms"] else math.nan))
    if not out:
        return []
    rr = [a for a, _ in out if not math.isnan(a)]
    lr = [b for _, b in out if not math.isnan(b)]
    return [f"perf_analyzer delivered at least {min(rr):.0%}-{max(rr):.0%} of the asked rate (server-counted requests "
            f"over its whole wall time, start-up and drain included), the load driver "
            f"{min_rate(res):.0%}-{max_rate(res):.0%}; "
            f"perf_analyzer's average latency / the load driver's at the same cell: {min(lr):.2f}-{max(lr):.2f}x "
            f"(median {statistics.median(lr):.2f}x)."]


def model_section(res: dict, img_rel: str, st: Settings) -> list[str]:
    kind = res["model"]
    sc = res["scaling"]
    key = f"{st.sched_sla_multiple:g}x"
    L = [f"## {kind}: {res['description']}", "",
         f"**Regime: {sc['regime']}** (per-sample latency falls {sc['gain']:.2f}x from batch 1 to the best batch "
         f"size up to {res['max_batch_size']}; {res['stages']} stages). Single-request latency t1 = "
         f"{res['t1_ms']:.2f} ms ("
         + ("serial in the backend, mean" if kind in SEQ2SEQ_KINDS else "whole graph under Triton, median")
         + f" of {res['calibration_requests']} sequential "
         f"requests; lazy backend {fmt(res['t1_lazy_ms'], '.2f')} ms, serial {fmt(res['t1_serial_ms'], '.2f')} "
         f"ms): batch-1 service rate mu = {res['mu']:.2f}/s. SLA targets: "
         + ", ".join(f"{m:g}x t1 = {s:.1f} ms" for m, s in zip(st.sla_multiples, res["sla_ms"]))
         + f"; eager, lazy and oracle schedule by the {key} target. Tritonserver {res['tritonserver']}.", "",
         f"![{kind}: latency, violations and throughput vs load]({img_rel})", "",
         "### Goals", ""]
    judged = res | {"sched_multiple": st.sched_sla_multiple}
    L += [f"- {g}" for g in goals(judged) + simulated_goals(judged)]
    vs = default_vs_best(res)
    if vs:
        L += ["", "### The default policy (eager) against the best baseline, with the spread over slices", ""] + vs
    L += ["", "### Why (mechanisms, with this run's figures)", ""] + [f"- {w}" for w in why(res, st)]
    L += [""] + simulated_table(judged) if res.get("simulated") else []
    cell = st.seq2seq_duration if kind in SEQ2SEQ_KINDS else st.duration
    L += ["", f"### `lazybatch load` (open-loop Poisson, Python asyncio gRPC client), {cell:g} s per cell"
          " (see Method)",
          "", "asked/s: offered rate; sent/s: what the client sent; server/s: requests Triton counted for the "
          "model in the cell (warm-up excluded) over the cell's time. b̄: mean executed batch (samples per stage run "
          "for our scheduler; inferences per execution for Triton's batcher). pre/mrg: preemptions and merges.", "",
          *table_head(["load", "policy", "asked/s", "sent/s", "server/s", "thr/s", "avg ms", "p50", "p99",
                       *(f"viol {m:g}x" for m in st.sla_multiples), "b̄", "pre", "mrg", "err"])]
    for c in sorted(res["cells"], key=lambda c: (c["load"], ROW_ORDER.index(c["policy"]))):
        L.append(f"| {c['load']:.0%} | {c['policy']} | {c['rate']:.1f} | {c['send_rate']:.1f} | "
                 f"{c['server_rate']:.1f} | {c['throughput']:.1f} | {fmt(c['avg_ms'])} | {fmt(c['p50_ms'])} | "
                 f"{fmt(c['p99_ms'])} | " + " | ".join(f"{v:.1%}" for v in c["violation"].values())
                 + f" | {fmt(c['mean_batch'], '.2f')} | {fmt(c['preemptions'], 'd')} | {fmt(c['merges'], 'd')} "
                 f"| {c['errors']} |")
    same = sum(1 for c in res["cells"] if c["server_requests"] == c["sent"])
    worst = max(res["cells"], key=lambda c: abs(c["server_requests"] - c["sent"]))
    send = [c["send_rate"] / c["rate"] for c in res["cells"]]
    L += ["", f"Offered rate check: the client sent {min(send):.0%}-{max(send):.0%} of the asked rate (a Poisson "
          f"sample of a few hundred arrivals differs from its mean by several percent); Triton counted exactly the "
          f"requests the client sent in {same} of {len(res['cells'])} cells"
          + (f" (largest difference: {worst['server_requests'] - worst['sent']:+d} at {worst['load']:.0%} "
             f"{worst['policy']})" if same < len(res["cells"]) else "") + "."]
    if res["perf"]:
        L += ["", f"### perf_analyzer (Poisson, --async, 3 windows of {st.perf_measurement_ms} ms, stability check "
              "off)", "", "server/s: requests Triton counted over perf_analyzer's whole run / its wall time, which "
              "includes its start-up and the wait for the last answers (for slow models a large share): a lower "
              "bound of the rate it sent; thr/s is what it measured inside its windows. Δavg: perf_analyzer's "
              "average latency / the load driver's in the same cell.", "",
              *table_head(["load", "policy", "asked/s", "server/s", "thr/s", "avg ms", "p50", "p99", "Δavg",
                           "note"])]
        by = {(c["policy"], c["load"]): c for c in res["cells"]}
        for pc in sorted(res["perf"], key=lambda c: (c["load"], ROW_ORDER.index(c["policy"]))):
            c = by.get((pc["policy"], pc["load"]))
            ok = "avg_ms" in pc
            ratio = pc["avg_ms"] / c["avg_ms"] if ok and c and c["avg_ms"] else math.nan
            L.append(f"| {pc['load']:.0%} | {pc['policy']} | {pc['rate']:.1f} | "
                     f"{pc['server_requests'] / pc['wall_s']:.1f} | {fmt(pc.get('throughput'))} | "
                     f"{fmt(pc.get('avg_ms'))} | {fmt(pc.get('p50_ms'))} | {fmt(pc.get('p99_ms'))} | "
                     f"{fmt(ratio, '.2f')} | {pc.get('error') or ''} |")
        L += [""] + [f"- {n}" for n in driver_notes(res)] + [
            "- Why the drivers can disagree: (1) where a policy is near or past its capacity, latency depends on "
            "how long the queue has been building: the load driver's cell is cut into slices that each start from an"
            " empty queue, perf_analyzer's three windows follow its warm-up back to back; (2) perf_analyzer's "
            "Poisson schedule has a fixed seed, and short windows were seen to send fewer requests than asked "
            "(perf_analyzer 2.41, the one `lazybatch perf` installs; docs/triton.md, \"Clients\"); "
            "compare its thr/s with the asked rate; (3) the "
            "Python asyncio client and perf_analyzer's C++ client cost different CPU time on the cores the server "
            "uses; (4) the two ran minutes apart on a machine whose background load drifts. Where the two agree "
            "within a few ms (light load), the figures carry; where they do not, the policy is at its limit."]
    return L + [""]


def write_page(results: list[dict], meta: dict, st: Settings, page: Path, img_dir: Path) -> None:
    page.parent.mkdir(parents=True, exist_ok=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(img_dir, page.parent)
    for res in results:
        res["scaling"]["regime"] = regime_of(res["scaling"], res["max_batch_size"])
    plot_scaling(results, img_dir / "regimes_scaling.png")
    for res in results:
        plot_model(res, img_dir / f"regimes_{res['model']}.png", st)
    L = ["# Where batching pays: every policy on a real Triton server", "",
         "Generated by `benchmarks/bench_regimes.py` (do not edit by hand; rerun the command). "
         "Users pick a batcher by how it behaves on their model and hardware: this page measures every policy of "
         "the lazybatch backend and Triton's own dynamic batcher on models in different batching regimes, from "
         "light load to overload, on a real tritonserver.", "",
         "```", meta["command"], "```", "",
         f"- Run: {meta['started']} to {meta['finished']} UTC ({meta['elapsed_min']:.1f} min)."
         + "".join(f" Models {', '.join(x['models'])} come from a further run on the same machine, "
                   f"{x['started']} to {x['finished']} UTC ({x['elapsed_min']:.1f} min, load average "
                   f"{x['loadavg_before']} / {x['loadavg_after']}, commit `{x['commit']}`"
                   + ("; policies in reverse order in every other slice" if x.get("alternating") else "")
                   + f"): `{x['command']}`." for x in meta.get("extra_runs", []))
         + (f" The page was rendered from the {len(meta['extra_runs']) + 1} runs' results with `--from-results`"
            " (a later run's model replaces the earlier one's)." if meta.get("extra_runs") else ""),
         f"- Machine: {meta['cpu']} ({meta['cores']} cores), {meta['platform']}. Load average before / after: "
         f"{meta['loadavg_before']} / {meta['loadavg_after']}. "
         + ("**The machine was shared with other jobs during this run** (server, load generator and others on the "
            "same cores): timings drift, differences of a few ms or a few points of violations are noise."
            if meta["shared"] else "The machine was reported quiet (`--quiet-machine`)."),
         f"- Versions: Python {meta['python']}, onnxruntime {meta['onnxruntime']}, tritonserver "
         f"{meta['tritonserver']} (nvidia-pytriton {meta['pytriton']}), tritonclient {meta['tritonclient']}, "
         f"perf_analyzer 2.41 (from the tritonclient 2.41.0 wheel), numpy {meta['numpy']}, lazybatch commit "
         f"`{meta['commit']}`.",
         f"- Method: per model one tritonserver; loads {', '.join(f'{f:.0%}' for f in st.loads)} of the batch-1 "
         f"service rate"
         + (f" (models whose profile shows batching pays also at {', '.join(f'{f:.0%}' for f in st.overload_loads)}"
            ", for their peak throughput)" if st.overload_loads else "")
         + f"; {st.duration:g} s of open-loop Poisson load per policy and load (light loads stretched up to "
         f"{2 * st.duration:g} s to hold about {st.min_requests} requests), in {st.slices} slices in which the "
         f"policies take turns" + (" (in reverse order in every other slice)" if meta.get("alternating") else "")
         + f"; perf_analyzer at {', '.join(f'{f:.0%}' for f in st.perf_loads) or '-'}"
         f". SLA targets {', '.join(f'{m:g}x' for m in st.sla_multiples)} the model's single-request latency; eager, "
         f"lazy and oracle schedule by {st.sched_sla_multiple:g}x. Policies: "
         + ", ".join(f"`{p}` ({VARIANTS.get(p, ALL_POLICIES[p])})" for p in st.policies)
         + "".join(f", `{v}` ({VARIANTS[v]}; {', '.join(ms)} only)" for v, ms in variants_in(results).items()
                   if v not in st.policies) + "."
         + (" Seq2seq models (gnmt) run graph:0/5/20 inside the backend (`graph_0ms`, `graph_5ms`, `graph_20ms`) in "
            f"place of Triton's dynamic batcher, which has no decoder loop; their requests take a few hundred ms "
            f"each, so their cells last {st.seq2seq_duration:g} s (light loads up to {2 * st.seq2seq_duration:g} s) "
            "and their t1 is the mean over the same 20 seeded requests served one at a time (serial)." if any(r["model"] in SEQ2SEQ_KINDS
                                                                                     for r in results) else ""), "",
         "## Batch-scaling curves (the regimes)", "",
         "Per-sample latency vs batch size from each model's profiled latency table (sum of its stages, "
         "onnxruntime CPU, this run).", "",
         f"![per-sample latency vs batch size]({rel}/regimes_scaling.png)", "",
         *table_head(["model", "stages", "batch-1 ms", "per-sample ms at each batch size", "gain", "regime"])]
    for res in results:
        sc = res["scaling"]
        L.append(f"| {res['model']} | {res['stages']} | {sc['t1_ms']:.2f} | "
                 + ", ".join(f"b{b}: {v:.2f}" for b, v in zip(sc["batch_sizes"], sc["per_sample_ms"]))
                 + f" | {sc['gain']:.2f}x | {sc['regime']} |")
    L.append("")
    for k, note in NOT_SERVED.items():
        if k not in {r["model"] for r in results}:
            L += [f"- {note}", ""]
    L += ["## Choosing a policy", ""]
    L += summary(results, st) + [""]
    for res in results:
        L += model_section(res, f"{rel}/regimes_{res['model']}.png", st)
    data = meta.get("data_copy")
    where = f"[{os.path.relpath(data, page.parent)}]({os.path.relpath(data, page.parent)})" if data else \
        f"`{meta['results_json']}`"
    L += ["## Raw data", "", f"Every cell (latencies summarised, server counters, backend statistics, the settings "
          f"of the run): {where}. `--from-results FILE` renders this page again from such a file.", ""]
    page.write_text("\n".join(L))


def variants_in(results: list[dict]) -> dict[str, list[str]]:
    """Variants some model of a merged page was measured under (--from-results A,B: B's run may have asked)."""
    found: dict[str, list[str]] = {}
    for res in results:
        for v in sorted({c["policy"] for c in res["cells"]} & set(VARIANTS)):
            found.setdefault(v, []).append(res["model"])
    return found


def summary(results: list[dict], st: Settings) -> list[str]:
    """A few generated lines per model: which policy had the lowest average latency and violations, per load."""
    key = f"{st.sched_sla_multiple:g}x"
    out = []
    for res in results:
        loads = sorted({c["load"] for c in res["cells"]})
        best_lat, best_v = [], []
        for f in loads:
            cs = [c for c in res["cells"] if c["load"] == f]
            a = min(cs, key=lambda c: c["avg_ms"] if not math.isnan(c["avg_ms"]) else math.inf)
            v = min(cs, key=lambda c: c["violation"][key])
            best_lat.append(f"{f:.0%} {a['policy']}")
            best_v.append(f"{f:.0%} {v['policy']}")
        out.append(f"- **{res['model']}** ({res['scaling']['regime']}, {res['scaling']['gain']:.2f}x): lowest "
                   f"average latency: {', '.join(best_lat)}; fewest violations at {key}: {', '.join(best_v)}.")
    return out
