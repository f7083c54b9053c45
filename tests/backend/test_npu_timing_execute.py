"""npu_timing's execute() with several requests in one call (what Triton hands an instance when requests queue up):
each gets its own response, a bad one never spoils the others. Triton's pb_utils is replaced by a minimal stand-in
(this is a unit test of execute's per-request handling; tests/triton/test_npu_timing.py runs the real server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import lazybatch.backend.npu_timing as nt
from lazybatch.npu_repo import add_npu_timing
from lazybatch.staging import make_mlp, split_model


class _Tensor:
    def __init__(self, name, arr):
        self._name, self._arr = name, arr

    def name(self):
        return self._name

    def as_numpy(self):
        return self._arr


class _Error(Exception):
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class _Response:
    def __init__(self, output_tensors, error=None):
        self.outputs = {t._name: t._arr for t in output_tensors}
        self.error = error


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setattr(nt, "pb_utils", SimpleNamespace(Tensor=_Tensor, TritonError=_Error,
                                                        InferenceResponse=_Response))
    repo = tmp_path / "repo"
    mlp = make_mlp(tmp_path / "m.onnx", in_dim=8, width=16, depth=2, out_dim=4)
    stages = split_model(mlp, tmp_path / "st", max_stages=2)
    (repo / "m" / "1").mkdir(parents=True)
    import shutil

    shutil.copytree(stages, repo / "m" / "1" / "stages")
    mdir = add_npu_timing(repo)
    m = nt.TritonPythonModel()
    m.initialize({"model_config": json.dumps({"name": "npu_timing", "parameters": {}}),
                  "model_repository": str(mdir), "model_version": "1"})
    return m


def _req(**tensors):
    def arr(k, v):
        return np.array([x.encode() for x in v], dtype=object) if k in ("model", "layer") else np.array(v, np.int32)
    return SimpleNamespace(inputs=lambda: [_Tensor(k, arr(k, v)) for k, v in tensors.items()])


def test_one_call_many_requests(model):
    reqs = [_req(model=["m"], batch=[1, 4]), _req(model=["nope"], batch=[1]), _req(layer=["gemm:1,8,8"], batch=[2]),
            _req(model=["m"], stage=[7], batch=[1]), _req(model=["m"], batch=[0]), _req(model=["m"], batch=[1, 4])]
    out = model.execute(reqs)
    assert len(out) == len(reqs)
    good = [out[0], out[2], out[5]]
    assert all(r.error is None for r in good)
    assert out[0].outputs["latency_us"].shape == (len(out[0].outputs["stage_name"]), 2)
    np.testing.assert_array_equal(out[0].outputs["cycles"], out[5].outputs["cycles"])
    assert out[2].outputs["cycles"].shape == (1, 1)
    for i, says in ((1, "unknown model 'nope'"), (3, "out of range"), (4, "batch size(s) [0]")):
        assert out[i].error is not None and says in str(out[i].error) and out[i].error.code == "INVALID_ARG"
