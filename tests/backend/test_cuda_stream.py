"""One CUDA stream for an instance's sessions (sessions/cuda_stream.py): the window of runs in flight, the refusals
off CUDA and without cupy, and the served path running through a ``SharedStream`` (its events from a stand-in for
cupy, on onnxruntime's CPU provider) with answers bit-identical to the plain device path."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from lazybatch.backend.stages import StageRunner, shared_stream
from lazybatch.sessions.cuda_stream import RunWindow, SharedStream, StreamRefused, open_stream
from lazybatch.sessions.device_tensors import provider_list

from tests.backendhelpers import FakeCupy, relu_split_mlp


def test_the_window_keeps_at_most_depth_runs_in_flight_and_waits_in_order():
    waited: list[int] = []
    marks = iter(range(100))
    w = RunWindow(lambda: next(marks), waited.append, depth=1)
    w.queued()
    assert waited == [] and w.in_flight == 1, "the first run is left in flight: the host returns at once"
    w.queued()
    assert waited == [0] and w.in_flight == 1, "queuing run 1 waits for run 0, not for run 1"
    w.queued()
    w.drain()
    assert waited == [0, 1, 2] and w.in_flight == 0 and w.waits == 3


def test_depth_zero_waits_for_every_run_and_a_negative_depth_is_refused():
    waited: list[int] = []
    marks = iter(range(10))
    w = RunWindow(lambda: next(marks), waited.append, depth=0)
    w.queued()
    w.queued()
    assert waited == [0, 1] and w.in_flight == 0
    with pytest.raises(ValueError, match="at least 0"):
        RunWindow(lambda: 0, lambda e: None, depth=-1)


def test_refused_off_cuda_and_without_cupy(monkeypatch):
    with pytest.raises(StreamRefused, match="needs the CUDA execution provider.*CPUExecutionProvider"):
        open_stream(["CPUExecutionProvider"])
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(StreamRefused, match="needs cupy.*cupy-cuda1"):
        open_stream(["CUDAExecutionProvider", "CPUExecutionProvider"])


def test_the_setting_asks_for_the_device_path_and_says_why_not():
    off = SimpleNamespace(shared_cuda_stream=False, execution_provider="cpu")
    assert shared_stream(off, True, 0) == (None, None), "not asked: no stream and nothing to log"
    on = SimpleNamespace(shared_cuda_stream=True, execution_provider="cpu")
    stream, why = shared_stream(on, False, 0)
    assert stream is None and "device_tensors is off" in why
    stream, why = shared_stream(on, True, 0)
    assert stream is None and "CUDA execution provider" in why


def test_cuda_sessions_are_put_on_the_stream():
    stream = SharedStream(FakeCupy(), device_id=1)
    cuda = provider_list(["CUDAExecutionProvider", "CPUExecutionProvider"], 1, stream=stream)
    assert cuda[0] == ("CUDAExecutionProvider", {"device_id": "1", "user_compute_stream": str(0x5EED),
                                                 "has_user_compute_stream": "1"})
    assert cuda[1] == "CPUExecutionProvider"
    assert provider_list(["CPUExecutionProvider"], stream=stream) == ["CPUExecutionProvider"]


def test_the_stream_is_blocking_and_its_run_options_skip_the_sync():
    fake = FakeCupy()
    stream = SharedStream(fake, device_id=2)
    assert fake.blocking is True, "a blocking stream keeps onnxruntime's default-stream copies ordered with it"
    assert fake.device_id == 2
    opts = stream.run_options()
    assert opts.get_run_config_entry("disable_synchronize_execution_providers") == "1"
    import onnxruntime as ort

    own = ort.RunOptions()
    assert stream.run_options(own) is own
    assert own.get_run_config_entry("disable_synchronize_execution_providers") == "1"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return relu_split_mlp(tmp_path_factory.mktemp("stream_mlp"), depth=5)


def test_the_served_path_on_a_shared_stream_answers_as_without_one(mlp):
    """Every device run goes through the window (never more than one in flight), a host read drains it first, the
    answers equal the plain device path's bit for bit, and the profiler times stages with the stream's events."""
    _, stages = mlp
    plain = StageRunner(stages, execution_provider="cpu", device_tensors=True)
    fake = FakeCupy()
    stream = SharedStream(fake)
    runner = StageRunner(stages, execution_provider="cpu", device_tensors=True, stream=stream)
    assert runner.resident is not None and runner.resident.stream is stream and runner.stream is stream
    feeds = plain.sample_inputs(4, seed=3)
    want = plain.run_all_resident({k: v.copy() for k, v in feeds.items()})
    before = stream.window.waits
    tensors = dict(feeds)
    for spec in runner.manifest.stages:
        tensors.update(runner.run_resident(spec.index, {i.name: tensors[i.name] for i in spec.inputs}, owned=True))
        assert stream.window.in_flight <= 1 and fake.unfinished <= 1
    assert stream.window.in_flight == 1, "the last stage is still in flight until its output is read"
    got = {o: runner.to_host([(tensors[o], k) for k in range(4)]) for o in runner.output_names}
    assert stream.window.in_flight == 0 and fake.unfinished == 0, "a host read waits for every queued run"
    assert stream.window.waits - before >= runner.n_stages
    for o in want:
        assert got[o].tobytes() == want[o].tobytes()
    table = runner.profile([1, 2], reps=1)
    assert table.meta["profile"]["statistic"] == "median" and all(table.latency(s, b) > 0 for s in range(runner.n_stages) for b in (1, 2))
    assert fake.unfinished == 0


def test_host_path_runners_take_no_stream(mlp):
    _, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu", device_tensors=False, stream=SharedStream(FakeCupy()))
    assert runner.stream is None, "host numpy between stages: every run synchronises as it returns"


def test_asked_for_off_cuda_the_model_loads_and_logs_why(tmp_path, capfd):
    from tests.backend.test_cuda_graphs import _served

    m = _served(tmp_path, shared_cuda_stream="true", device_tensors="true")
    try:
        assert m.runtime.runner.resident is not None and m.runtime.runner.stream is None
        assert "shared_cuda_stream off: it needs the CUDA execution provider" in capfd.readouterr().err
    finally:
        m.finalize()
