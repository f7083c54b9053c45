"""StageChain and ``lazybatch profile`` on the device-resident path (sessions/device_tensors.py), on the CPU
provider: the same bits as numpy between stages, in-place residual stages written over their device input, and a
profile that records which path it timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lazybatch.onnx_tools.manifest import load_manifest
from lazybatch.onnx_tools.profile import profile_dir
from lazybatch.sessions.chain import StageChain, random_feeds


@pytest.fixture(scope="module")
def split_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    root = tmp_path_factory.mktemp("device_chain")
    export_model("resnet50", root / "m.onnx", small=True, seed=0)
    split_model(root / "m.onnx", root / "s", graph_optimization_level="all")  # has in-place residual stages
    return root / "s", load_manifest(root / "s")


@pytest.mark.parametrize("batch", [1, 3])
def test_device_chain_equals_host_chain_bit_for_bit(split_all, batch):
    d, man = split_all
    host, dev = StageChain(d, man), StageChain(d, man, device_tensors=True)
    assert dev.inplace, "the ort-all split has in-place stages: the device path must cover them"
    feeds = random_feeds(man["graph_inputs"], batch, np.random.default_rng(batch))
    before = {k: v.copy() for k, v in feeds.items()}
    want, got = host.run_chain(feeds), dev.run_chain(feeds)
    for name, w in want.items():
        assert isinstance(got[name], np.ndarray) and got[name].tobytes() == w.tobytes(), name
    assert all(np.array_equal(feeds[k], before[k]) for k in feeds), "model inputs are never overwritten"
    whole_h, whole_d = host.run_whole(feeds), dev.run_whole(feeds)
    assert all(whole_d[n].tobytes() == whole_h[n].tobytes() for n in whole_h)
    kept = dev.run_chain(feeds, keep_all=True)  # every tensor between stages, copied to the host
    assert all(isinstance(v, np.ndarray) for v in kept.values())


def test_device_chain_keeps_tensors_on_the_device_and_writes_in_place(split_all):
    d, man = split_all
    dev = StageChain(d, man, device_tensors=True)
    env = dict(random_feeds(man["graph_inputs"], 2, np.random.default_rng(0)))
    for k in range(len(dev.stages)):
        step = dev.inplace.get(k)
        given = env[step.input] if step is not None else None
        dev.run_stage(k, env)
        out = env[man["stages"][k]["outputs"][0]["name"]]
        assert not isinstance(out, np.ndarray), f"stage {k}'s output went back to host numpy"
        if step is not None:
            assert out is given, f"in-place stage {k} did not write over its device input"
    assert dev.tensors.uploads == len(man["graph_inputs"]), "a model input is uploaded once"


def test_profile_on_the_device_path_records_it(split_all, tmp_path):
    d, _ = split_all
    on = profile_dir(d, batch_sizes=[1, 2], repeat=1, warmup=0, rounds=1, progress=False, device_tensors=True)
    off = profile_dir(d, batch_sizes=[1, 2], repeat=1, warmup=0, rounds=1, progress=False)
    assert on.meta["device_tensors"] is True and off.meta["device_tensors"] is False  # auto: off on the CPU
    assert len(on.meta["whole_graph_latency_s"]) == 2 and all(x > 0 for row in on.measured for x in row)
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, "-m", "lazybatch", "profile", str(d), "--batch-sizes", "1,2", "--repeat", "1",
                    "--warmup", "0", "--device-tensors", "true", "--no-plot", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    assert json.loads(out.read_text())["meta"]["device_tensors"] is True
