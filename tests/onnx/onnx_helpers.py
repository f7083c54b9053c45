"""Helpers shared by the ONNX tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def light(name: str) -> Path:
    """Path of one of the model-zoo graphs the onnx package ships (batch 1, generated weights)."""
    p = LIGHT / f"light_{name}.onnx"
    assert p.is_file(), f"the onnx package should ship {p}"
    return p


def listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}



def small_resnet_split(root: Path) -> Path:
    """The small ResNet-50 exported and split under ``root`` (m.onnx, s/): the process-wide session settings'
    tests run it in fresh processes."""
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    export_model("resnet50", root / "m.onnx", small=True, seed=0)
    split_model(root / "m.onnx", root / "s")
    return root


def in_fresh_process(code: str, cwd: Path) -> dict:
    """Run ``code`` in a new Python process (a process-wide onnxruntime switch must not reach pytest's) and return
    the JSON object its last line prints."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
