"""The streaming results page (docs/results/streaming.md), generated whole from its raw data: time to first token
of the three decoder models streamed (`bench_streaming`, `lazybatch load` and perf_analyzer).

    python -m benchmarks.streaming_page            # rewrite docs/results/streaming.md and its plot from docs/data/

A page of its own, apart from the decoder page: each re-runs in well under a
session on 2 cores, the decoder sweep about two hours, these rounds under one. Every figure comes from the data
files named in ``SOURCES``, one run each; the goal's verdicts come from the one rule
(benchmarks/harness/verdict.py) on the range over repetitions. The README's streaming row is ``readme_line``."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.reports import streaming as streaming_report
from benchmarks.harness.page import commits, generate, goals_table, load_sources, run_header
from benchmarks.harness.plots import log_panels
from benchmarks.harness.stats import fmt, spread
from benchmarks.harness.verdict import count, count_text, judge_spread

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
PAGE = ROOT / "docs" / "results" / "streaming.md"
MODELS = streaming_report.MODELS
NAME = {"lm": "LM", "gnmt": "GNMT", "transformer": "Transformer"}


def _suffix(m: str) -> str:
    return "" if m == "lm" else f"_{m}"


SOURCES = {**{f"streaming_{m}": f"streaming{_suffix(m)}.json" for m in MODELS},
           **{f"streaming_perf_{m}": f"streaming_perf_analyzer{_suffix(m)}.json" for m in MODELS}}
# the perf_analyzer rounds are rendered where their data is there (a run may stop before them; data from an earlier
# run must then be deleted, not mixed in: tests/meta/test_docs_data.py fails a page whose data spans commits)
OPTIONAL = {f"streaming_perf_{m}" for m in MODELS}


def load(data: Path) -> dict[str, dict]:
    return load_sources(data, SOURCES, OPTIONAL)


def streaming_goal(res: dict, driver: str) -> tuple[str, str, str, dict, str, str]:
    base, cells = res["unloaded"], [c for c in res["cells"] if abs(c["load"] - streaming_report.GOAL_LOAD) < 1e-9]
    r = spread([c["ttft_avg_ms"] / base[c["rep"]]["eager"]["ttft_ms"] for c in cells if c["policy"] == "eager"])
    return (NAME[res["model"]], f"{streaming_report.GOAL_LOAD:.0%}", f"eager TTFT / unloaded TTFT ({driver})", r,
            f"<= {streaming_report.GOAL:g}", judge_spread(r, streaming_report.GOAL, lower_is_better=True))


def goal_rows(src: dict[str, dict]) -> list[tuple]:
    return ([streaming_goal(src[f"streaming_{m}"], "lazybatch load") for m in MODELS]
            + [streaming_goal(src[k], "perf_analyzer") for k in (f"streaming_perf_{m}" for m in MODELS) if k in src])


def plot(src: dict[str, dict], path: Path) -> bool:
    """Mean TTFT against load per model under `lazybatch load`, each policy's unloaded TTFT at 0%."""
    def draw(ax: Any, res: dict) -> None:
        for p in streaming_report.POLICIES:
            idle = statistics.fmean(b[p]["ttft_ms"] for b in res["unloaded"])
            loads = sorted({c["load"] for c in res["cells"] if c["policy"] == p})
            ys = [statistics.fmean(c["ttft_avg_ms"] for c in res["cells"] if c["policy"] == p and c["load"] == f)
                  for f in loads]
            ax.plot([0] + [100 * f for f in loads], [idle, *ys], marker="o", label=p,
                    linewidth=2 if p == "eager" else 1)

    return log_panels([src[f"streaming_{m}"] for m in MODELS], draw,
                      lambda res: f"{NAME[res['model']]} streamed (t1 {res['t1_ms']:.0f} ms)",
                      "load, % of the batch-1 rate (0: unloaded)", "mean time to first token (ms)", path)


def render(src: dict[str, dict], img: str | None) -> list[str]:
    m = src["streaming_lm"]["meta"]
    lines = [
        "# Streaming: time to first token", "",
        run_header("streaming_page", "streaming", src, SOURCES, m, "the LM's round"), "",
        "**Models**: the three decoder models of [decoder.md](decoder.md) (the LM, GNMT, the Transformer), each "
        "decoupled (`repo default --model <kind> --decoupled`: a response at every token). **Policies**: eager "
        "with the decoupled default admission (`admission=first_token`: every queued request joins the running "
        "decode at the next boundary, up to the batch cap), `eager_curves` (`eager:admission=curves`, the rule of "
        "models that answer once) and Triton's batcher at 0/5/20 ms, which streams too but makes a newcomer wait "
        "for the running batch. Unloaded values: at the start of every repetition, 20 requests one at a time, the "
        "policies taking turns. TTFT ratio: mean TTFT at the load / mean unloaded TTFT of the same policy in the "
        "same repetition. Under perf_analyzer only eager and eager_curves run: Triton's batcher leaves requests "
        "waiting longer than perf_analyzer's windows at this load.", "",
        "**Goal**: TTFT at 90% load <= 2x its unloaded value. Verdicts by the one rule "
        "(benchmarks/harness/verdict.py) on the range over repetitions: met only where the whole range clears the "
        "goal, missed where it is all on the other side, otherwise a tie. The noise floor is that range (no "
        "identical copy of a configuration runs in these rounds).", "",
        "## Verdicts", "",
        *goals_table(goal_rows(src)), "",
    ]
    if img:
        lines += [f"![time to first token against load]({img})", ""]
    for title, keys in (("Under `lazybatch load`", [f"streaming_{m}" for m in MODELS]),
                        ("Under perf_analyzer", [f"streaming_perf_{m}" for m in MODELS])):
        present = [k for k in keys if k in src]
        if not present:
            continue
        lines += [f"## {title}", ""]
        for k in present:
            lines += ["```bash", src[k]["meta"]["command"], "```", "", *streaming_report.report(src[k]), ""]
    lines += ["## Earlier rounds", "",
              "Until commit 0cd9c15 these rounds were a section of the decoder page; earlier rounds and the "
              "investigations they held (the admission rules replayed, a response every 4 tokens, perf_analyzer's "
              "fixed schedule) are in git history: `git log -p -- docs/results/decoder.md`.", ""]
    return lines


def readme_line(src: dict[str, dict]) -> str:
    """The README's streaming row (one line of about 150 characters: the verdicts and the commit): the
    per-cell count over both drivers and the cell furthest from the goal, with its range."""
    rows = goal_rows(src)
    worst = max(rows, key=lambda r: r[3]["mean"])
    return (f"| [Streaming](docs/results/streaming.md) | TTFT at 90% load / idle (goal <= 2x): "
            f"{count_text(count(r[5] for r in rows))}; worst {worst[0]} {fmt(worst[3])} ({worst[2].rsplit('(', 1)[1]}; "
            f"{', '.join(commits(src))} |")


def main(argv: list[str] | None = None) -> int:
    return generate(__doc__, DATA, PAGE, "streaming_ttft.png", load, plot, render, argv)


if __name__ == "__main__":
    sys.exit(main())
