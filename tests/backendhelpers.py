"""Shared helpers for the tests that load the Triton backend model in-process (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format

from lazybatch.backend.config_pbtxt import load_config
from lazybatch.backend.model import TritonPythonModel


def initialize_model(mdir: Path, cfg: Any = None, **params: str) -> TritonPythonModel:
    """``TritonPythonModel.initialize`` as Triton calls it, on ``mdir``'s config.pbtxt (or ``cfg``), with
    ``params`` set as config parameters; the caller finalizes it."""
    cfg = load_config(mdir / "config.pbtxt") if cfg is None else cfg
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    m = TritonPythonModel()
    m.initialize({"model_config": json_format.MessageToJson(cfg), "model_repository": str(mdir),
                  "model_version": "1"})
    return m


def relu_split_mlp(root: Path, *, depth: int) -> tuple[Path, Path]:
    """A small MLP (16 -> 32 wide -> 8) and its stages cut after every Relu: (model, stage dir)."""
    import onnx

    from lazybatch.staging import make_mlp, split_model

    model = make_mlp(root / "mlp.onnx", in_dim=16, width=32, depth=depth, out_dim=8)
    relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
    return model, split_model(model, root / "stages", cut_after=relus)


class FakeCupy:
    """cupy's few calls that ``sessions/cuda_stream.SharedStream`` makes, on the host clock: so that its window and
    event timing run, on onnxruntime's CPU provider, with the code the CUDA provider runs. An event records when it
    was marked; ``unfinished`` counts events marked and not yet passed (waiting for one passes every earlier one, as
    on one stream)."""

    def __init__(self) -> None:
        import time
        import types

        fake = self

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
                self.at: float | None = None

            def record(self, stream: Any) -> None:
                self.at = time.perf_counter()
                fake.pending.append(self)

            def synchronize(self) -> None:
                if self in fake.pending:
                    del fake.pending[:fake.pending.index(self) + 1]

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                fake.blocking = not non_blocking
                self.ptr = 0x5EED

        class Device:
            def __init__(self, device_id: int) -> None:
                fake.device_id = device_id

            def __enter__(self) -> None:
                return None

            def __exit__(self, *exc: Any) -> None:
                return None

        self.pending: list[Any] = []
        self.blocking: bool | None = None
        self.device_id: int | None = None
        self.cuda = types.SimpleNamespace(Event=Event, Stream=Stream, Device=Device,
                                          get_elapsed_time=lambda a, b: (b.at - a.at) * 1e3)

    @property
    def unfinished(self) -> int:
        return len(self.pending)
