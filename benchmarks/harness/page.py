"""Markdown the results pages share: a table's header and rule, and writing a page. The pages render byte for byte
from their raw data (tests re-render them), so the layout lives here once rather than in each script."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from benchmarks.harness.stats import fmt
from benchmarks.harness.verdict import count, count_text


def table_head(columns: Sequence[str], *, compact: bool = False) -> list[str]:
    """A markdown table's header row and rule for ``columns`` (``compact``: ``|---|`` cells, as older pages wrote)."""
    rule = "|---" * len(columns) + "|" if compact else "| --- " * len(columns) + "|"
    return ["| " + " | ".join(columns) + " |", rule]


def write_page(path: Path, lines: Sequence[str]) -> Path:
    """Write a page's lines (joined by newlines, as every page is) and make its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def page_cli(doc: str, data: Path, page: Path, data_help: str,
             argv: Sequence[str] | None = None) -> tuple[Path, Path, Path]:
    """The page generators' options (``--data``, ``--page``, ``--img-dir``): the raw data, the page to write and the
    plots' folder (by default docs/img beside the page's folder, which the page links as ``../img/``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--data", default=str(data), help=data_help)
    ap.add_argument("--page", default=str(page), help=f"the page to write ({'/'.join(page.parts[-3:])})")
    ap.add_argument("--img-dir", default=None, help="where the plot goes (default: docs/img beside the page's folder)")
    args = ap.parse_args(argv)
    out = Path(args.page)
    return Path(args.data), out, Path(args.img_dir) if args.img_dir else out.parent.parent / "img"


def write_generated(page: Path, lines: Sequence[str], img: Path | None) -> None:
    """Write a generated page and say so (``img``: the plot drawn beside it, None where matplotlib is missing)."""
    write_page(page, lines)
    print(f"wrote {page}" + (f" and {img}" if img else " (no plot: matplotlib is not installed)"))


def goals_table(rows: Sequence[tuple]) -> list[str]:
    """A page's verdict table: rows of (model, load, figure, its spread or None, goal, verdict), then the per-cell
    count (a row whose verdict starts "not measured" is counted apart)."""
    out = table_head(["model", "load", "figure", "mean [min-max] over repetitions", "goal", "verdict"])
    for model, f, what, s, goal, v in rows:
        out.append(f"| {model} | {f} | {what} | {fmt(s) if s else '-'} | {goal} | {v} |")
    judged = [r[5] for r in rows if not r[5].startswith("not measured")]
    gaps = len(rows) - len(judged)
    return out + ["", f"Per cell: {count_text(count(judged))}" + (f"; {gaps} not measured." if gaps else ".")]


def commits(src: dict[str, dict]) -> list[str]:
    """The commits a page's raw data files record (one, once the page holds one run)."""
    return sorted({d["meta"]["commit"] for d in src.values()})
