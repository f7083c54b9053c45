"""Standard tools with their default options: perf_analyzer's default random data and Triton's own HTTP
and gRPC clients with any float data, NaN and Inf included, as Triton's own backends serve them."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from lazybatch import perf


@pytest.fixture(scope="module")
def perf_analyzer():
    return perf.find_perf_analyzer() or perf.install()


def _perf_default(binary, url: str, model: str, out) -> tuple[int, str]:
    """perf_analyzer with no data option at all (its default: random bytes)."""
    cmd = perf.command(binary, model, url, [40], measurement_ms=1500, max_trials=6, stability_percentage=1000.0)
    assert "--input-data" not in cmd and "--shape" not in cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    (out / f"{model}.log").write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("model", ["wide_eager", "wide_triton0"])
def test_perf_analyzer_default_data_is_served(served, perf_analyzer, tmp_path, model):
    """Every request of a perf_analyzer run with default options is answered with a result, on an eager model and
    on a triton:<us> one (Triton's batcher in front of the whole graph)."""
    before = _triton_counts(served, model)
    rc, text = _perf_default(perf_analyzer, served.grpc, model, tmp_path)
    # perf_analyzer exits non-zero where its windows never agree ("Failed to obtain stable measurement": once in a
    # suite run with another process spinning on one of the two cores, even at stability_percentage 1000); that
    # is about the machine, not the answers, which Triton's own counts below judge either way
    unstable = "Failed to obtain stable measurement" in text
    assert rc == 0 or unstable, text[-2000:]
    assert "error" not in text.lower().replace("standard deviation", ""), text[-2000:]
    assert unstable or "Throughput:" in text
    ok, failed = (a - b for a, b in zip(_triton_counts(served, model), before))
    assert ok >= 20 and failed == 0, (ok, failed)


def _triton_counts(served, model: str) -> tuple[int, int]:
    """Triton's own statistics: requests that succeeded and that failed."""
    st = grpcclient.InferenceServerClient(served.grpc).get_inference_statistics(model).model_stats[0]
    return st.inference_stats.success.count, st.inference_stats.fail.count


def test_perf_analyzer_default_data_holds_nan_a_strict_model_refuses_it(served, perf_analyzer, tmp_path):
    """The control: the same graph with allow_nan: false refuses perf_analyzer's default data, which shows that
    the data above did hold NaN/Inf (so the test above can fail), and that the strict check still works."""
    rc, text = _perf_default(perf_analyzer, served.grpc, "wide_strict", tmp_path)
    assert rc != 0 or "error" in text.lower()
    assert "NaN/Inf" in text, text[-2000:]


def _special(batch: int) -> np.ndarray:
    x = np.random.default_rng(7).standard_normal((batch, 4096)).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    x[-1, 10] = np.float32(3e38)
    return x


def _reference(served, model: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(served.repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("model", ["wide_eager", "wide_triton0"])
def test_triton_clients_send_any_float_data(served, model):
    """NaN, +-Inf and huge floats through tritonclient's gRPC and HTTP clients: the answer is onnxruntime's on the
    whole graph, NaN where it gives NaN, and the rows without special values are untouched by the others."""
    x = _special(3)
    want = _reference(served, model, x)
    assert np.isnan(want[0]).any() and np.isfinite(want[1]).all()  # the special values reached the output
    g = grpcclient.InferenceServerClient(served.grpc)
    t = grpcclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    got_g = g.infer(model, [t]).as_numpy("y")
    h = httpclient.InferenceServerClient(served.http)
    t = httpclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    got_h = h.infer(model, [t]).as_numpy("y")
    for got in (got_g, got_h):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
