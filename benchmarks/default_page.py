"""The static-models results page (docs/results/default.md), generated whole from one run's raw data
(docs/data/default.json, written by `bench_default --json`).

    python -m benchmarks.default_page              # rewrite docs/results/default.md and its plot from docs/data/

The page opens with its verdict, computed here from the data by the one rule (benchmarks/harness/verdict.py): per
driver, eager against an identical copy of Triton's stock configuration pooled over every cell, the per-cell counts
beside that copy's, the cells missed, and peak throughput. The README's static line is ``readme_line``. Earlier
rounds and their diagnoses are in git history (``git log -p -- docs/results/default.md``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.reports import default as default_report
from benchmarks.harness import fmt
from benchmarks.harness.page import page_cli, write_generated
from benchmarks.harness.verdict import count_line

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data" / "default.json"
PAGE = ROOT / "docs" / "results" / "default.md"
DRIVERS = {"load": "`lazybatch load`", "perf": "NVIDIA perf_analyzer"}
SHORT = {"load": "(lazybatch load)", "perf": "(perf_analyzer)"}  # the README row's driver names


def runs_of(data: dict) -> list[dict]:
    """A run's own default.json, or docs/data/default.json (``{"runs": [...]}``)."""
    return data.get("runs", [data])


def restarted(runs: list[dict]) -> bool:
    """Whether every run drew fresh sessions per repetition (--restart): the pooled interval's draws."""
    return all(run["meta"].get("restart") for run in runs)


def drivers(results: list[dict]) -> list[str]:
    return [d for d in DRIVERS if any(c["driver"] == d for res in results for c in res["cells"])]


def peak_ratios(res: dict, driver: str) -> tuple[float, float]:
    """(eager, the identical copy) peak throughput / best Triton configuration's."""
    pk = default_report.peaks(res, driver)
    best = max(pk[p] for p in default_report.TRITON)
    return pk["eager"] / best, pk[default_report.TWIN] / best


def missed_cells(results: list[dict], driver: str) -> list[str]:
    """The settled cells whose range falls below the goal (best Triton avg / eager avg >= 1.00), eager's and the
    copy's (an unsettled cell has no verdict: harness/method.py)."""
    out = []
    for res in results:
        for r in default_report.ratios(res, driver):
            if not r["settled"]:
                continue
            for who, s in (("eager", r["avg"]), ("the copy", r["twin"])):
                if s and default_report.verdict(s, 1.0) == "missed":
                    out.append(f"{res['model']} {r['load']:.0%} ({who} {fmt(s)})")
    return out


def model_lines(results: list[dict], driver: str, restart: bool) -> list[str]:
    """Each model's own pooled figure: "never slower" holds per model, and a cost on one model can hide in a level
    pool of four. Its draws are that model's servers (three with --restart and 3 repetitions: a coarse interval)."""
    out = []
    for res in results:
        p = default_report.pooled([res], driver, restart)
        if p is not None:
            out.append(f"{res['model']} {default_report.interval(p)}, {p['verdict'].split(' (')[0]}")
    return out


def behind_models(results: list[dict], driver: str, restart: bool) -> list[str]:
    """The models whose own pooled interval is below 1.00 (``model_lines``)."""
    return [res["model"] for res in results
            if (p := default_report.pooled([res], driver, restart)) is not None and p["verdict"] == "behind"]


def verdict_lines(results: list[dict], restart: bool) -> list[str]:
    lines = ["## Verdict", ""]
    for d in drivers(results):
        p = default_report.pooled(results, d, restart)
        if p is None:
            continue
        missed = missed_cells(results, d)
        peak = "; ".join(f"{res['model']} {e:.2f}x (the copy {t:.2f}x)"
                         for res in results for e, t in [peak_ratios(res, d)])
        pooled_n = p["cells"] - p.get("unsettled", 0) - p.get("unsustained", 0)
        lines += [f"- **Under {DRIVERS[d]}: eager / an identical copy of Triton 0 ms, pooled over {pooled_n} of "
                  f"{p['cells']} cells (the rest have no settled noise floor, or a queue grew there and the "
                  f"throughput judges them), {default_report.interval(p)}: "
                  f"{p['verdict']}.** "
                  f"Goal \"never slower\" (best Triton avg / eager avg >= 1.00), "
                  f"{count_line(p['counts']['eager'], p['counts']['twin'])}."
                  + (f" Missed: {', '.join(missed)}." if missed else "")
                  + f" Peak throughput / best Triton's: {peak}."]
        lines += [f"  - Per model ({DRIVERS[d]}): " + "; ".join(model_lines(results, d, restart)) + "."]
    inline = [r["inline"]["mean"] for res in results for d in drivers(results) for r in default_report.ratios(res, d)
              if r["inline"]]
    if inline:
        share = f"{min(inline):.0%}" if f"{min(inline):.0%}" == f"{max(inline):.0%}" else \
            f"{min(inline):.0%}-{max(inline):.0%}"
        lines += [f"- Eager answered {share} of its requests per cell inline (whole "
                  "passes in Triton's `execute`, Triton's own route); the rest went through its scheduler thread."]
    lines += ["", "How to read it: one cell cannot resolve a few percent (the identical copy's own cells stray as "
              "far as eager's: its met and missed above are the per-cell rule's false verdicts on this machine), so "
              "the pooled line is the verdict: per cell, the mean log ratio of eager's goal ratio minus the copy's, "
              "averaged over the cells, with a 90% bootstrap interval from resampling the session draws, not the "
              "cells (`pooled` in benchmarks/reports/default.py): identical onnxruntime sessions run a few percent apart, and every "
              "cell one server ran shares its sessions, so a server's cells are one draw (with `--restart`, one "
              "per model, driver and repetition; without, one per model). An interval that straddles 1.00 is a "
              "tie: eager level with Triton's stock configuration, as the simulated ceiling (last column) says any "
              "schedule is on these static graphs, within a few percent.", "",
              "The method's rules per cell (benchmarks/harness/method.py): a cell has a verdict of its own only "
              "where every repetition's identical copy scored within 0.90-1.10x (else \"no verdict ... run "
              "longer\", which counts as not met, and `--settle` reruns it at twice the length); the requests each "
              "p99 rests on are shown, pooled over the repetitions, and a p99 on fewer than 1,000 is unresolved; a "
              "cell whose load generator fell below 95% of its schedule's pace is client-bound; a run whose second "
              "half's median latency was over 1.2x its first's was not sustained (a queue grew: its average says "
              "how long the run was); the machine's busy time over all cores (/proc/stat, the client included) "
              "stands beside each cell. Columns show \"-\" for runs from before these were recorded.", ""]
    return lines


def readme_line(data: dict) -> str:
    """The README's static-models row (about 150 characters of text): per driver the pooled verdict and
    figure with its interval, the models behind on their own, the commit, a link."""
    runs = runs_of(data)
    results = [res for run in runs for res in run["results"]]
    ds = drivers(results)
    parts, behind = [], {}
    for d in ds:
        p = default_report.pooled(results, d, restarted(runs))
        word = {"ahead": "ahead", "behind": "behind"}.get(p["verdict"], "tie" if p["verdict"].startswith("level")
                                                            else "unresolved")
        span = "no interval" if p["lo"] != p["lo"] else f"{p['lo']:.3f}-{p['hi']:.3f}"
        figure = f" {p['ratio']:.3f} [{span}]" if p["ratio"] == p["ratio"] else ", no cell settled"
        parts.append(f"{word}{figure} {SHORT[d]}")
        for m in behind_models(results, d, restarted(runs)):
            behind.setdefault(m, []).append(SHORT[d])
    by_driver: dict[str, list[str]] = {}  # "(perf_analyzer)" -> the models behind under it alone
    for m, on in behind.items():
        by_driver.setdefault("" if len(on) == len(ds) else f" {', '.join(on)}", []).append(m)
    tail = "; behind" + ",".join(f" {', '.join(ms)}{on}" for on, ms in by_driver.items()) if by_driver else ""
    return (f"| [Static models](docs/results/default.md) | eager vs Triton 0 ms: {', '.join(parts)}"
            f"{tail}; {runs[0]['meta']['commit']} |")


def render(data: dict, img: str | None) -> list[str]:
    runs = runs_of(data)
    results = [res for run in runs for res in run["results"]]
    lines = ["# The default policy (eager) against Triton's dynamic batcher", "",
             "Generated by `python -m benchmarks.default_page` from the raw data of one run (do not edit by hand; "
             "`python -m benchmarks.pages default` prints the commands that re-run it).", ""]
    lines += verdict_lines(results, restarted(runs))
    for run in runs:
        lines += ["## The run", ""] + default_report.header(run["meta"])[2:]
        for d in drivers(run["results"]):
            lines += [f"## Under {DRIVERS[d]}", ""]
            for res in run["results"]:
                lines += default_report.report(res, d) + [""]
            lines += default_report.pooled_line(run["results"], d, bool(run["meta"].get("restart")))
    if img:
        lines += [f"![best Triton / eager average latency per load, served beside the simulated ceiling]({img})", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    data_path, page, img_dir = page_cli(__doc__, DATA, PAGE, "the run's raw data (docs/data/default.json)", argv)
    data = json.loads(data_path.read_text())
    img = img_dir / "default_ratio.png"
    drawn = default_report.plot([res for run in runs_of(data) for res in run["results"]], img)
    write_generated(page, render(data, f"../img/{img.name}" if drawn else None), img if drawn else None)
    print("README line:\n" + readme_line(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
