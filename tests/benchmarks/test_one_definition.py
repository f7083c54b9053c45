"""The benchmarks' percentile and SLA-violation rule are defined once, in benchmarks/harness/stats.py: a page that
computed its p99 or its violations another way would not be comparable with the others."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from benchmarks.harness.stats import percentile, violation

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "benchmarks" / "harness" / "stats.py"
OTHER_DEFINITIONS = re.compile(r"^\s*def (percentile|violation|_?p99)\(|np\.percentile\(|numpy\.percentile\(|"
                               r"\.quantile\(", re.M)


def test_no_benchmark_defines_its_own_percentile_or_violation_rule():
    found = []
    for f in sorted((ROOT / "benchmarks").rglob("*.py")):
        if f == HOME:
            continue
        for m in OTHER_DEFINITIONS.finditer(f.read_text()):
            found.append(f"{f.relative_to(ROOT)}: {m.group(0).strip()}")
    assert not found, "use benchmarks/harness/stats.py's percentile and violation: " + "; ".join(found)


def test_the_harness_percentile_is_numpys_linear_one():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 1000):
        x = rng.exponential(3.0, n)
        for q in (50, 90, 99):
            assert math.isclose(percentile(x, q), float(np.percentile(x, q)), rel_tol=1e-12)
    assert math.isnan(percentile([], 99))


def test_violation_counts_late_answers_and_failures_over_what_was_sent():
    assert violation([1.0, 5.0, 20.0], errors=1, sent=4, sla_ms=10.0) == 0.5
    assert math.isnan(violation([], errors=0, sent=0, sla_ms=10.0))
