"""The device-resident stage path (sessions/device_tensors.py, ``device_tensors``) on onnxruntime's CPU provider:
the same code the CUDA provider runs, checked bit for bit against the host-numpy path on preempt- and merge-heavy
schedules, through the runtime's own stage and span jobs and under its scheduler."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.backend.fusion import fuse
from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.rows import Parent, Sample
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Request, Status
from lazybatch.sessions.cuda_stream import SharedStream
from lazybatch.sessions.device_tensors import DeviceTensors, Rows

from tests.backend.test_backend import Collector
from tests.backendhelpers import FakeCupy, relu_split_mlp


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """The small ResNet-50 split with onnxruntime's full optimisation: it has in-place residual stages."""
    from lazybatch.onnx_tools.split import split_model as split_all
    from lazybatch.onnx_tools.zoo import export_model

    root = tmp_path_factory.mktemp("resident_resnet")
    export_model("resnet50", root / "m.onnx", small=True, seed=0)
    split_all(root / "m.onnx", root / "s", graph_optimization_level="all")
    return root / "m.onnx", root / "s"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return relu_split_mlp(tmp_path_factory.mktemp("resident_mlp"), depth=5)


def test_join_binds_consecutive_rows_and_concats_the_rest():
    dev = DeviceTensors(["CPUExecutionProvider"])
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = -np.arange(8, dtype=np.float32).reshape(2, 4)
    whole = dev.join([(a, 0), (a, 1), (a, 2)])
    assert not isinstance(whole, Rows) and dev.concats == 0  # all rows of one tensor: the tensor itself
    part = dev.join([(a, 1), (a, 2)])
    assert isinstance(part, Rows) and (part.start, part.n) == (1, 2) and dev.concats == 0  # bound by pointer
    assert dev.uploads == 1, "a model input is uploaded once per array"
    mixed = dev.join([(a, 2), (b, 0), (a, 0)])
    assert dev.concats == 1 and dev.uploads == 2
    assert mixed.numpy().tobytes() == np.concatenate([a[2:3], b[0:1], a[0:1]]).tobytes()
    # rows of a joined tensor, and rows of Rows (an in-place stage's output), join again
    again = dev.join([(Rows(mixed, 1, 2), 0), (Rows(mixed, 1, 2), 1)])
    assert isinstance(again, Rows) and (again.start, again.n) == (1, 2)
    out = dev.to_host([(part, 0), (part, 1)])
    assert out.tobytes() == a[1:3].tobytes()
    a[1] = 99  # the answer owns its memory
    assert out[0, 0] == 4.0
    assert dev.to_host([(b, 1), (a, 0)]).tobytes() == np.concatenate([b[1:2], a[0:1]]).tobytes()


@pytest.mark.parametrize("batch", [1, 3])
def test_resident_chain_is_bit_identical_with_inplace_stages(resnet, batch):
    _, stages = resnet
    host = StageRunner(stages, execution_provider="cpu")
    dev = StageRunner(stages, execution_provider="cpu", device_tensors=True)
    assert dev.resident is not None and dev.resident_refused is None
    assert dev.inplace, "the ort-all ResNet has in-place residual stages"
    x = host.sample_inputs(batch, seed=batch)
    want = host.run_all({k: v.copy() for k, v in x.items()})
    got = dev.run_all_resident({k: v.copy() for k, v in x.items()})
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    k = min(dev.inplace)  # and a stage really ran over its input on the device
    step = dev.inplace[k]
    feed = dev.resident.fresh(np.ones((2, *host.manifest.raw["stages"][k]["inputs"][0]["shape"][1:]),
                                      np.float32))
    assert dev.run_resident(k, {step.input: feed}, owned=True)[step.output] is feed


def test_a_device_path_that_differs_is_refused_at_load(mlp, monkeypatch):
    """The load-time check: any bit off on the warm-up batch and the model serves through host numpy, saying why."""
    _, stages = mlp
    real = DeviceTensors.to_host
    monkeypatch.setattr(DeviceTensors, "to_host", lambda self, parts: real(self, parts) + np.float32(1e-6))
    r = StageRunner(stages, execution_provider="cpu", device_tensors=True)
    assert r.resident is None and "differs from the host path's" in r.resident_refused
    assert r.join([(np.ones((2, 16), np.float32), 0)]).shape == (1, 16)  # host numpy: join_rows


def _samples(rng: np.random.Generator, n: int, dim: tuple[int, ...], name: str) -> tuple[list, list]:
    parents, reqs = [], []
    for h in range(n):
        b = int(rng.integers(1, 4))
        p = Parent(h, {name: rng.standard_normal((b, *dim)).astype(np.float32)}, b)
        parents.append(p)
        for row in range(b):
            r = Request(len(reqs), 0.0, payload=Sample(p, row))
            p.samples.append(r)
            reqs.append(r)
    return parents, reqs


def _replay(rt: BackendRuntime, reqs: list, schedule: list) -> None:
    for stage, stop, ids in schedule:
        batch = [reqs[i] for i in ids]
        if stop == stage + 1:
            rt._run_batch(stage, batch)
        else:
            rt._run_span(stage, stop, batch)


@pytest.mark.parametrize("model", ["resnet", "mlp"])
def test_runtime_jobs_are_bit_identical_on_a_preempt_and_merge_heavy_schedule(model, resnet, mlp):
    """The runtime's own stage and span jobs, replayed on one schedule through both paths: sub-batches formed in
    shuffled order (Concat on the device), preempted after one stage, merged with others that reached the same
    stage, split again, and spans of several stages (the whole graph as one pass among them); and with every stage
    replaying its graph per batch bucket, padded (sessions/cuda_graphs.py, without capture on the CPU); and with
    every session on one shared stream, one run in flight (sessions/cuda_stream.py, its events from a stand-in)."""
    onnx_path, stages = resnet if model == "resnet" else mlp
    out = {}
    for mode in ("host", "device", "graphs", "stream"):
        resident = mode != "host"
        fake = FakeCupy() if mode == "stream" else None
        runner = StageRunner(stages, execution_provider="cpu", device_tensors=resident,
                             graph_buckets=(1, 2, 4, 8) if mode == "graphs" else (),
                             stream=SharedStream(fake) if fake is not None else None)
        assert (runner.resident is not None) == resident
        assert (len(runner.graphs) == runner.n_stages) == (mode == "graphs"), runner.graphs_refused
        table = runner.profile([1, 2, 4, 8], reps=1)
        whole = fuse(runner, table, onnx_path, execution_provider="cpu", intra_op_threads=0, name="t")
        assert whole is not None
        rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8), Collector().respond,
                            whole_runner=whole[0], cancel_poll_s=0.0)
        try:
            rng = np.random.default_rng(5)
            name = runner.manifest.inputs[0].name
            dim = runner.sample_inputs(1)[name].shape[1:]
            parents, reqs = _samples(rng, 10, dim, name)
            n = runner.n_stages
            at = [0] * len(reqs)
            schedule = []
            srng = np.random.default_rng(11)
            whole_pass = [r.id for r in parents[0].samples]  # one job of every stage: the whole-graph pass
            schedule.append((0, n, whole_pass))
            for i in whole_pass:
                at[i] = n
            while any(s < n for s in at):
                stage = min(s for s in at if s < n) if srng.random() < 0.5 else int(srng.choice([s for s in at if s < n]))
                ready = [i for i, s in enumerate(at) if s == stage]
                k = int(srng.integers(1, min(8, len(ready)) + 1))
                ids = [int(i) for i in srng.permutation(ready)[:k]]  # shuffled: rows out of order
                stop = stage + 1 if srng.random() < 0.7 else int(srng.integers(stage + 1, n + 1))
                schedule.append((stage, stop, ids))
                for i in ids:
                    at[i] = stop
            _replay(rt, reqs, schedule)
            out[mode] = [{o: runner.to_host([r.payload.tensors[o] for r in p.samples])
                          for o in runner.output_names} for p in parents]
            if resident:
                assert runner.resident.concats > 0 and runner.resident.uploads > 0
            if mode == "graphs":
                assert all(g.replays > 0 for g in runner.graphs.values())
            if fake is not None:
                assert runner.stream.window.waits > len(schedule) and fake.unfinished == 0
                assert whole[0].stream is runner.stream, "the whole-graph span queues on the stages' stream"
        finally:
            rt.close()
    assert len(schedule) > 10
    for mode in ("device", "graphs", "stream"):
        for a, b in zip(out["host"], out[mode]):
            assert all(a[o].tobytes() == b[o].tobytes() for o in a), mode


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_scheduler_serves_the_device_path(mlp, policy):
    """Under the scheduler, requests arriving together: each answered once with its result, on the device path."""
    model, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu", device_tensors=True)
    table = runner.profile([1, 2, 4, 8], reps=1)
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy(policy).build(max_batch_size=8), c.respond,
                        is_cancelled=c.is_cancelled, cancel_poll_s=0.0)
    sess = ort.InferenceSession(str(model))
    xs = {h: np.random.default_rng(h).standard_normal((1 + h % 3, 16)).astype(np.float32) for h in range(40)}
    go = threading.Barrier(4)

    def producer(hs):
        go.wait()
        for h in hs:
            assert rt.submit(h, {"x": xs[h]}, xs[h].shape[0], RequestOptions(sla_s=float([0.001, 1][h % 2]))) is None

    threads = [threading.Thread(target=producer, args=(list(range(k, 40, 4)),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.wait_for(xs)
    rt.close()
    for h, ans in c.answers.items():
        assert len(ans) == 1
        outputs, status, error = ans[0]
        assert status is Status.OK, error
        np.testing.assert_allclose(outputs["y"], sess.run(None, {"x": xs[h]})[0], rtol=1e-5, atol=1e-6)
    assert runner.resident.uploads > 0 and rt.stats.stage_runs > 0


def test_a_cpu_upload_does_not_keep_its_input_alive():
    """On the CPU an OrtValue wraps (and holds) its numpy array: the upload cache must not hold it past its use."""
    import gc
    import weakref

    dev = DeviceTensors(["CPUExecutionProvider"])
    a = np.ones((2, 3), np.float32)
    gone = weakref.ref(a)
    v = dev.value(a)
    assert dev.value(a) is v and dev.uploads == 1  # while in use, one upload
    del a, v
    gc.collect()
    assert gone() is None, "the request's input outlived every use of it"
