"""docs/npu.md's simulator summaries (docs/data/npu_sim_*_summary.csv) still hold at this commit.

The CSVs were written by the `lazybatch simulate` commands docs/npu.md lists, on a virtual clock with seeded
arrivals: the figures depend on the code and the seeds, not on the machine or its load. So instead of a commit
recorded once, every commit re-runs one cell per file (the first lazy row's model, rate and SLA, with one other
policy of that cell) and compares it with the file: a change that moves these figures fails here until the
summaries are regenerated with the commands docs/npu.md lists."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "docs" / "data"
# file -> the options of its command besides models, policies, rates and SLAs (docs/npu.md)
EXTRA = {
    "npu_sim_paperscale_summary.csv": [],
    "npu_sim_paperscale_fig15_summary.csv": [],
    "npu_sim_paperscale_oracle_summary.csv": [],
    "npu_sim_paperscale_fig15_oracle_summary.csv": [],
    "npu_sim_paperscale_dec_timesteps_summary.csv": [],
    "npu_sim_paperscale_maxbatch16_summary.csv": ["--max-batch-size", "16"],
    "npu_sim_paperscale_maxbatch32_summary.csv": ["--max-batch-size", "32"],
    "npu_sim_asmodelled_summary.csv": [],
    "npu_sim_asmodelled_fig15_summary.csv": [],
}
# figures compared (the CSVs print six significant digits)
FIGURES = ("throughput", "avg_ms", "p50_ms", "p90_ms", "p99_ms", "sla_violation", "mean_batch", "preempt", "merge",
           "completed")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _cell(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The first lazy row (the oracle's where the file has one, as it is the slow one) and one other policy of the
    same model, rate and SLA, preferring the cheapest (the lowest rate among the file's lazy rows)."""
    lazy = sorted((r for r in rows if r["policy_spec"].startswith("lazy")), key=lambda r: float(r["rate"]))[0]
    same = [r for r in rows if (r["model"], r["rate"], r["sla_ms"]) == (lazy["model"], lazy["rate"], lazy["sla_ms"])
            and r is not lazy]
    other = next((r for r in same if r["policy_spec"] == "oracle"), None) or next(
        (r for r in same if not r["policy_spec"].startswith("lazy")), same[0])
    return [lazy, other]


def test_every_summary_is_checked():
    assert {p.name for p in DATA.glob("npu_sim_*_summary.csv")} == set(EXTRA)


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_the_summary_reproduces_at_this_commit(name, tmp_path):
    want = _cell(_rows(DATA / name))
    exe = shutil.which("lazybatch", path=str(Path(sys.executable).parent)) or "lazybatch"
    cmd = [exe, "simulate", "--model", want[0]["model"], "--rate", want[0]["rate"], "--sla-ms", want[0]["sla_ms"],
           "--seeds", want[0]["seeds"], "--no-plots", "--out", str(tmp_path), *EXTRA[name]]
    for r in want:
        cmd += ["--policy", r["policy_spec"]]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    got = {r["policy_spec"]: r for r in _rows(tmp_path / "summary.csv")}
    for r in want:
        g = got[r["policy_spec"]]
        for k in FIGURES:
            a, b = float(r[k]), float(g[k])
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9), (name, r["policy_spec"], k, a, b)
