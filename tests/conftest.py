"""Fixtures shared by every test folder."""

from __future__ import annotations

from typing import Callable

import pytest

from lazybatch.cli import main

from .simhelpers import flat_table


@pytest.fixture
def eight_nodes():
    return flat_table(8)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """cli('split', 'a.onnx', '--out', 'd') -> (exit code, stdout, stderr) of the real `lazybatch ...` CLI."""
    def run(*argv: object) -> tuple[int, str, str]:
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err
    return run
