"""A request's input tensors as the model's data path takes them: host numpy, or device tensors left on the GPU.

Why: with ``FORCE_CPU_ONLY_INPUT_TENSORS: "no"`` in config.pbtxt, Triton's Python backend hands a model the inputs
that arrive on a GPU (a client's CUDA shared memory, an ensemble's GPU step) as GPU tensors; ``as_numpy()`` fails on
them. Where the model's stage tensors live on that same GPU (``device_tensors``), such an input is wrapped as an
onnxruntime ``OrtValue`` through DLPack, no copy, and the first stage binds its rows by pointer. Everywhere else
(the host path, a whole-graph or inline pass, seq2seq, another GPU) it is copied to host memory once, here.
With Triton's default (``FORCE_CPU_ONLY_INPUT_TENSORS`` unset, "yes") every input arrives in host memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def keeps_gpu_inputs(resident: Any, inline: bool) -> int | None:
    """The GPU id whose inputs may stay on the device: the device path's, when it is on a GPU and no pass of the
    model reads host arrays (inline whole-graph passes run ``session.run``); else None."""
    if resident is None or resident.device != "cuda" or inline:
        return None
    return resident.device_id


def read_input(tensor: Any, gpu: int | None) -> Any:
    """One input: numpy where it is in host memory; a GPU input on GPU ``gpu`` an OrtValue on it; any other GPU
    input copied to the host."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    import onnxruntime as ort

    value = ort.OrtValue.from_dlpack(tensor.to_dlpack())  # no copy: the request's own device memory
    if gpu is not None and value.__dlpack_device__()[1] == gpu:
        return value
    return value.numpy()  # one copy to the host (onnxruntime copies a CUDA tensor out)


def read_inputs(request: Any, gpu: int | None, *, need_values: bool = False) -> dict[str, Any]:
    """The request's inputs by name. ``need_values``: every input in host memory (the model checks the values:
    ``allow_nan: false``)."""
    return {t.name(): read_input(t, None if need_values else gpu) for t in request.inputs()}


class DeviceInput:
    """The dtype and shape of a device input, as request validation reads a numpy array's."""

    __slots__ = ("dtype", "shape", "ndim", "size")

    def __init__(self, value: Any) -> None:
        from onnx.helper import tensor_dtype_to_np_dtype

        self.dtype = np.dtype(tensor_dtype_to_np_dtype(value.element_type()))
        self.shape = tuple(value.shape())
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))


def described(tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` with each device input replaced by its ``DeviceInput`` (what validation reads)."""
    if all(isinstance(v, np.ndarray) for v in tensors.values()):  # nearly always: no new dict
        return tensors
    return {k: v if isinstance(v, np.ndarray) else DeviceInput(v) for k, v in tensors.items()}
