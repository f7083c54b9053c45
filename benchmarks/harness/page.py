"""Markdown writing shared by the results pages: a table from its header and rows."""

from __future__ import annotations

from typing import Iterable, Sequence


def row(cells: Iterable[object]) -> str:
    """``| a | b |``"""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[object], rows: Iterable[Iterable[object]]) -> list[str]:
    """A markdown table's lines: the header, its ``|---|`` rule, one line per row."""
    return [row(header), "|" + "---|" * len(header), *(row(r) for r in rows)]
