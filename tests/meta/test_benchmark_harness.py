"""The benchmarks share one harness: the percentile, the time bins, the violation rule, the page's raw-data reader and
the plot's backend and saving are defined once, in benchmarks/harness/, so that every page computes its figures and
draws its plots alike. A second definition anywhere else under benchmarks/ fails here, with where it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "benchmarks" / "harness"
# names the harness defines once (harness/stats.py, harness/page.py)
ONCE = {"percentile", "bins", "violation", "load_sources"}
# calls that compute or draw what the harness does: the percentile (numpy's, statistics'), the plot's backend and
# its saving (harness/plots.py: pyplot, save)
CALLS = re.compile(r"\b(np\.percentile|numpy\.percentile|statistics\.quantiles|matplotlib\.use|\.savefig)\(")


def scripts() -> list[Path]:
    return [p for p in sorted((ROOT / "benchmarks").rglob("*.py")) if HARNESS not in p.parents]


def test_the_harness_defines_each_once():
    found = {node.name for p in HARNESS.glob("*.py") for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.FunctionDef)}
    assert ONCE <= found, f"the harness no longer defines {sorted(ONCE - found)}"


def test_no_benchmark_defines_its_own():
    again = [f"{p.relative_to(ROOT)}:{node.lineno}: def {node.name}" for p in scripts()
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.FunctionDef) and node.name in ONCE]
    calls = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in scripts()
             for i, line in enumerate(p.read_text().splitlines(), 1) if CALLS.search(line)]
    found = again + calls
    assert not found, ("use benchmarks/harness (stats.percentile, stats.bins, stats.violation, page.load_sources, "
                       "plots.pyplot and plots.save) instead of:\n" + "\n".join(found))


def test_the_check_sees_a_second_definition():
    src = "import numpy as np\ndef percentile(v, q):\n    return np.percentile(v, q)\n"
    tree = ast.parse(src)
    assert [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in ONCE] == ["percentile"]
    assert CALLS.search(src.splitlines()[2]) and CALLS.search("    fig.savefig(path)")
