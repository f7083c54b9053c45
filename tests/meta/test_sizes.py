"""docs/architecture.md's "Sizes": no source module over 500 lines, at most four over 400, and those four named
there, each as one job; counted at 120 columns by ``scripts/sizes.py``."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sizes_module():
    spec = importlib.util.spec_from_file_location("sizes", ROOT / "scripts" / "sizes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sizes_paragraph() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("### Sizes")
    return text[start:text.index("\n### ", start + 1)]


def test_a_wide_line_counts_once_per_120_columns():
    count = _sizes_module().count_lines
    assert count("x\n" + "y" * 120 + "\n" + "z" * 121 + "\n\n") == 1 + 1 + 2 + 1


def test_no_module_over_500_lines_and_the_few_over_400_are_named():
    sizes = _sizes_module()
    counts = sizes.sizes(ROOT)
    assert any(p.startswith("backend/") for p in counts) and not any(p.startswith("tests/") for p in counts)
    over = {p: n for p, n in counts.items() if n > sizes.MAX_LINES}
    assert not over, f"over {sizes.MAX_LINES} lines at 120 columns (split by job): {over}"
    long = {p: n for p, n in counts.items() if n > sizes.LONG_LINES}
    assert len(long) <= sizes.MAX_LONG, f"more than {sizes.MAX_LONG} modules over {sizes.LONG_LINES} lines: {long}"
    named = set(re.findall(r"`([a-z_/]+\.py)`", _sizes_paragraph()))
    assert set(long) <= named, f"over {sizes.LONG_LINES} lines but not named in architecture.md's Sizes: " \
                               f"{sorted(set(long) - named)}"
