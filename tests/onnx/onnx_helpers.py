"""Helpers shared by the ONNX tests."""

from __future__ import annotations

import os
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

