"""Which onnxruntime build this Python has, and what to tell a user where it has none.

onnxruntime comes as two builds that install the same ``onnxruntime`` module (``onnxruntime`` for CPUs,
``onnxruntime-gpu`` with the CUDA provider), so lazybatch names neither as a plain dependency: its ``cpu`` and
``gpu`` extras pick one (pyproject.toml).
"""

from __future__ import annotations

import sys
from typing import Any

from lazybatch.batcher.errors import ConfigError


def missing_message() -> str:
    return (f"onnxruntime is not installed in this Python ({sys.executable}): install lazybatch with one of its two "
            "builds, pip install 'lazybatch[cpu]' (onnxruntime) or 'lazybatch[gpu]' (onnxruntime-gpu, for CUDA); "
            "only one of the two may be present")


def is_missing_onnxruntime(e: BaseException) -> bool:
    return isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "onnxruntime"


def require_onnxruntime() -> Any:
    """The onnxruntime module, or a ConfigError that says which extra to install."""
    try:
        import onnxruntime
    except ModuleNotFoundError as e:
        if not is_missing_onnxruntime(e):
            raise
        raise ConfigError(missing_message()) from None
    return onnxruntime
