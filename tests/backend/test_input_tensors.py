"""Request inputs that Triton hands over on a GPU (``FORCE_CPU_ONLY_INPUT_TENSORS: "no"``, backend/input_tensors.py).

No GPU here: a stand-in for pb_utils' tensor reports ``is_cpu()`` False and hands out a DLPack capsule of host
memory, which onnxruntime wraps as it wraps a CUDA one. The device path that then serves it is the real one on
onnxruntime's CPU provider."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.backend.input_tensors import described, keeps_gpu_inputs, read_input, read_inputs
from lazybatch.backend.request_parsing import RequestOptions, validate_request
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.formats.stage_manifest import TensorSpec
from lazybatch.batcher.policies import parse_policy

from tests.backend.test_backend import Collector
from tests.backendhelpers import relu_split_mlp


class _Tensor:
    """pb_utils.Tensor's reading side: ``is_cpu``, ``as_numpy`` (host only, as in Triton), ``to_dlpack``."""

    def __init__(self, name: str, arr: np.ndarray, *, cpu: bool) -> None:
        self._name, self._arr, self._cpu = name, arr, cpu

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return self._cpu

    def as_numpy(self) -> np.ndarray:
        if not self._cpu:
            raise RuntimeError("as_numpy() on a GPU tensor")  # what the stub raises
        return self._arr

    def to_dlpack(self):
        return self._arr.__dlpack__()


def test_host_inputs_stay_numpy_and_device_inputs_are_wrapped_without_a_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert read_input(_Tensor("x", a, cpu=True), 0) is a
    v = read_input(_Tensor("x", a, cpu=False), 0)  # on the device path's GPU: kept there
    assert isinstance(v, ort.OrtValue) and v.data_ptr() == a.ctypes.data and v.shape() == [3, 4]
    for gpu in (None, 1):  # the host path, or another GPU: one copy to the host
        h = read_input(_Tensor("x", a, cpu=False), gpu)
        assert isinstance(h, np.ndarray) and h.tobytes() == a.tobytes()
    req = SimpleNamespace(inputs=lambda: [_Tensor("x", a, cpu=False)])
    assert isinstance(read_inputs(req, 0, need_values=True)["x"], np.ndarray)  # allow_nan false reads values


def test_a_device_input_is_validated_by_its_dtype_and_shape():
    spec = [TensorSpec("x", np.dtype(np.float32), (4,))]
    good = read_input(_Tensor("x", np.ones((3, 4), np.float32), cpu=False), 0)
    assert validate_request(described({"x": good}), spec, 8) == (3, None)
    bad = read_input(_Tensor("x", np.ones((3, 5), np.float32), cpu=False), 0)
    assert "has shape [3, 5], expected [batch, 4]" in validate_request(described({"x": bad}), spec, 8)[1]
    wrong = read_input(_Tensor("x", np.ones((3, 4), np.float64), cpu=False), 0)
    assert "dtype float64, expected float32" in validate_request(described({"x": wrong}), spec, 8)[1]
    host = {"x": np.ones((1, 4), np.float32)}
    assert described(host) is host  # the common case builds nothing


def test_gpu_inputs_stay_only_where_every_pass_runs_on_the_device():
    on_gpu = SimpleNamespace(device="cuda", device_id=1)
    assert keeps_gpu_inputs(on_gpu, inline=False) == 1
    assert keeps_gpu_inputs(on_gpu, inline=True) is None  # inline whole-graph passes run session.run on host arrays
    assert keeps_gpu_inputs(SimpleNamespace(device="cpu", device_id=0), inline=False) is None
    assert keeps_gpu_inputs(None, inline=False) is None


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_the_device_path_serves_requests_whose_inputs_arrived_on_the_device(tmp_path, policy):
    model, stages = relu_split_mlp(tmp_path, depth=4)
    runner = StageRunner(stages, execution_provider="cpu", device_tensors=True)
    table = runner.profile([1, 2, 4], reps=1)
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy(policy).build(max_batch_size=4), c.respond, cancel_poll_s=0.0)
    sess = ort.InferenceSession(str(model))
    xs = {h: np.random.default_rng(h).standard_normal((1 + h % 3, 16)).astype(np.float32) for h in range(12)}
    try:
        for h, x in xs.items():
            v = read_input(_Tensor("x", x, cpu=False), 0)
            batch, err = validate_request(described({"x": v}), runner.manifest.inputs, 4)
            assert err is None
            assert rt.submit(h, {"x": v}, batch, RequestOptions(sla_s=1.0)) is None
        c.wait_for(list(xs))
    finally:
        rt.close()
    for h, x in xs.items():
        [(outputs, status, error)] = c.answers[h]
        assert error is None, error
        np.testing.assert_allclose(outputs["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
