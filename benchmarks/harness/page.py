"""Markdown the results pages share: a table's header and rule, and writing a page. The pages render byte for byte
from their raw data (tests re-render them), so the layout lives here once rather than in each script."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def table_head(columns: Sequence[str], *, compact: bool = False) -> list[str]:
    """A markdown table's header row and rule for ``columns`` (``compact``: ``|---|`` cells, as older pages wrote)."""
    rule = "|---" * len(columns) + "|" if compact else "| --- " * len(columns) + "|"
    return ["| " + " | ".join(columns) + " |", rule]


def write_page(path: Path, lines: Sequence[str]) -> Path:
    """Write a page's lines (joined by newlines, as every page is) and make its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
