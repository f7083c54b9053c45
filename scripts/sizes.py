"""Line counts of the project's non-test Python files, at 120 columns: the figure docs/architecture.md's "Sizes"
holds the code to (no module over 500 lines, at most four over 400, each named there as one job).

A line wider than 120 columns counts once per 120 columns it spans, so that a count cannot be met by joining lines;
docstrings and comments count like code. ``python scripts/sizes.py`` prints the files over the threshold (``--over``,
default 400) and the totals per top-level folder; ``tests/meta/test_sizes.py`` checks the rules.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = 120
MAX_LINES = 500  # no module over this
LONG_LINES = 400  # at most MAX_LONG modules over this, each named in docs/architecture.md
MAX_LONG = 4


def source_files(root: Path = ROOT) -> list[Path]:
    """Tracked Python files outside tests/ (the working tree's where git is absent)."""
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True).stdout
        files = [root / p for p in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in root.rglob("*.py") if ".venv" not in p.parts and "build" not in p.parts]
    return sorted(p for p in files if p.is_file() and p.relative_to(root).parts[0] != "tests")


def count_lines(text: str, columns: int = COLUMNS) -> int:
    """Lines at ``columns`` columns: a line of 121-240 characters counts two."""
    return sum(max(1, -(-len(line) // columns)) for line in text.splitlines())


def sizes(root: Path = ROOT) -> dict[str, int]:
    """Path relative to the root -> its line count at 120 columns."""
    return {str(p.relative_to(root)): count_lines(p.read_text(encoding="utf-8")) for p in source_files(root)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--over", type=int, default=LONG_LINES, help="list the files over this many lines")
    args = ap.parse_args(argv)
    counts = sizes()
    for path, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if n > args.over:
            print(f"{n:6d}  {path}")
    folders: dict[str, int] = {}
    for path, n in counts.items():
        top = path.split("/")[0] if "/" in path else "."
        folders[top] = folders.get(top, 0) + n
    print("per folder: " + ", ".join(f"{k} {v}" for k, v in sorted(folders.items(), key=lambda kv: -kv[1])))
    print(f"total {sum(counts.values())} lines in {len(counts)} files (tests/ excluded), at {COLUMNS} columns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
