"""Fixtures of the NPU tests: the zoo's small models, exported and split once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

@pytest.fixture(scope="session")
def small_split(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """small_split('gnmt') -> the split directory of the zoo's small gnmt (made once)."""
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    made: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("npu_small")

    def get(name: str) -> Path:
        if name not in made:
            src = root / f"{name}.onnx"
            export_model(name, src, small=True)
            split_model(src, root / f"{name}_stages")
            made[name] = root / f"{name}_stages"
        return made[name]
    return get
