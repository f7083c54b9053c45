"""Where a figure comes from: the machine, the versions, the commit and the command that measured it, and the raw
data written beside the figures (docs/data/)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository


def machine_meta() -> dict:
    """The machine, the versions and the commit a run measured (a dirty tree says so)."""
    import numpy
    import onnxruntime

    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def ver(dist: str) -> str:
        try:
            from importlib.metadata import version

            return version(dist)
        except Exception:
            return "?"
    full = git_commit()
    commit = "?" if full is None else full[:7] + (" + uncommitted changes" if full.endswith("+dirty") else "")
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__, "pytriton": ver("nvidia-pytriton"),
            "tritonclient": ver("tritonclient"), "commit": commit,
            "loadavg_before": " ".join(f"{v:.1f}" for v in os.getloadavg())}


def git_commit() -> str | None:
    """The checkout's HEAD commit, with "+dirty" when tracked files outside docs/ differ from it (recorded with the
    figures). Changes under docs/ do not count: a page's commands write their raw data into docs/data/ one after the
    other, and the second must not call the first's output a dirty tree; nothing under docs/ is run."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)docs"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def command_line() -> str:
    """The command that ran this benchmark, as one would type it again: ``python -m benchmarks.<name> ...`` for a
    script run as a module of the package (how they run: benchmarks/README.md), else the script's path."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    argv = ["-m", spec.name, *sys.argv[1:]] if spec is not None and spec.name else sys.argv
    return " ".join([Path(sys.executable).name, *argv])


def write_json(path: str | Path, data: Any, *, compact: bool = False) -> Path:
    """``data`` as JSON at ``path`` (its folder made); ``compact``: no indentation, for raw data of every request."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text((json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=1)) + "\n")
    return p
