"""The device-resident stage path (``device_tensors: "true"``) on a real tritonserver, on onnxruntime's CPU provider:
the same models with host numpy between stages answer the same bits, one request at a time, under eager and lazy;
a burst from many clients is answered once each with its result; a bad request gets its error and harms no other.
A seq2seq model (the small GNMT) decodes the same tokens with its carried state on the device as through numpy.
"""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.client.api import Client
from lazybatch.client.seq2seq import Seq2SeqInfo, make_request
from lazybatch.onnx_tools.split import split_model
from lazybatch.onnx_tools.zoo import export_model
from lazybatch.repo import add_model
from lazybatch.serving import TritonServer, free_port
from lazybatch.staging import make_mlp

POLICIES = ("eager", "lazy")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("device_tensors")
    model = make_mlp(root / "mlp.onnx", in_dim=16, width=64, depth=6, out_dim=8)
    repo = root / "models"
    for policy in POLICIES:
        for resident in ("true", "false"):
            add_model(model, repo, name=f"{policy}_{resident}", policy=policy, max_batch_size=8, profile_reps=1,
                      execution_provider="cpu",
                      # Triton's own switch for GPU inputs: on a CPU server every input still arrives on the host
                      parameters={"device_tensors": resident,
                                  **({"FORCE_CPU_ONLY_INPUT_TENSORS": "no"} if resident == "true" else {})})
    export_model("gnmt", root / "gnmt.onnx", small=True, seed=3)
    split_model(root / "gnmt.onnx", root / "gnmt_stages")
    table = None
    for resident in ("true", "false"):
        add_model(None, repo, name=f"gnmt_{resident}", policy="lazy", sla_ms=2000, max_batch_size=4,
                  stages=root / "gnmt_stages", latency_table=table, profile_reps=1, execution_provider="cpu",
                  intra_op_threads=1, parameters={"device_tensors": resident})
        table = repo / f"gnmt_{resident}" / "1" / "latency.json"
    log = root / "tritonserver.log"
    srv = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_file=log,
                       env={"OMP_NUM_THREADS": "1"})
    srv.start(timeout=300)
    try:
        yield srv, model, log
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_device_path_answers_the_host_paths_bits(server, policy):
    srv, model, log = server
    text = log.read_text()
    assert f"lazybatch: {policy}_true: stage tensors stay on the cpu device between stages" in text
    assert f"lazybatch: {policy}_false: stage tensors stay" not in text
    rng = np.random.default_rng(3)
    with Client(srv.endpoints.grpc) as c:
        for batch in (1, 3, 8):
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            dev, host = c.infer(f"{policy}_true", {"x": x})["y"], c.infer(f"{policy}_false", {"x": x})["y"]
            assert dev.tobytes() == host.tobytes()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_burst_on_the_device_path_is_answered_once_each(server, policy):
    srv, model, _ = server
    whole = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    xs = [np.random.default_rng(k).standard_normal((1 + k % 3, 16)).astype(np.float32) for k in range(48)]

    def one(k: int):
        with Client(srv.endpoints.grpc) as c:
            if k == 5:  # one bad request among them: its error, the others unharmed
                with pytest.raises(Exception, match=r"(?i)shape"):
                    c.infer(f"{policy}_true", {"x": np.zeros((1, 15), np.float32)})
            return c.infer(f"{policy}_true", {"x": xs[k]})["y"]

    with cf.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(one, range(len(xs))))
    for x, y in zip(xs, got):
        np.testing.assert_allclose(y, whole.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_seq2seq_decodes_the_same_tokens_with_its_state_on_the_device(server):
    srv, _, log = server
    assert "lazybatch: gnmt_true: stage tensors stay on the cpu device between stages" in log.read_text()
    info = Seq2SeqInfo(8, 6, 50)
    rng = np.random.default_rng(11)
    feeds = [make_request(rng, info, int(rng.integers(1, 8)), int(rng.integers(2, 6)), batch=1 + k % 2,
                          ignore_eos=True) for k in range(8)]

    def one(k: int) -> tuple[np.ndarray, np.ndarray]:
        with Client(srv.endpoints.grpc) as c:  # at once: sequences at different timesteps share decoder steps
            return (c.infer("gnmt_true", feeds[k])["output_tokens"], c.infer("gnmt_false", feeds[k])["output_tokens"])

    with cf.ThreadPoolExecutor(8) as pool:
        for dev, host in pool.map(one, range(len(feeds))):
            assert dev.tolist() == host.tolist()
