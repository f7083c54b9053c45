"""Helpers shared by the ONNX tests (a uniquely named module: tests/ has no packages)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import onnx
import pytest

from lazybatch.cli import main

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def light(name: str) -> Path:
    """Path of one of the model-zoo graphs the onnx package ships (batch 1, generated weights)."""
    p = LIGHT / f"light_{name}.onnx"
    assert p.is_file(), f"the onnx package should ship {p}"
    return p


def listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """cli('split', 'a.onnx', '--out', 'd') -> (exit code, stdout, stderr) of the real `lazybatch ...` CLI."""
    def run(*argv: object) -> tuple[int, str, str]:
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err
    return run
