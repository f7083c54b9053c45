"""The seq2seq runtime without a server: validation, the decoder loop against the reference runner, graph padding.

The real-server tests are tests/triton/test_seq2seq.py; these run the same runtime in-process (respond callback
instead of Triton response senders) so that a failure points at the loop, not at the server.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lazybatch.backend.config import RequestOptions
from lazybatch.backend.faults import FaultInjector
from lazybatch.backend.seq2seq import Seq2SeqRuntime, Seq2SeqSpec, build_policy
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.client.seq2seq import LengthSampler, Seq2SeqInfo, make_request
from lazybatch.onnx_tools.runtime import StageChain
from lazybatch.onnx_tools.seq2seq import Seq2SeqRunner
from lazybatch.onnx_tools.split import split_model
from lazybatch.onnx_tools.zoo import export_model
from lazybatch.repo import profile_seq2seq


@pytest.fixture(scope="module", params=["gnmt", "transformer"])
def split(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    export_model(request.param, root / "m.onnx", small=True, seed=5)
    split_model(root / "m.onnx", root / "s")
    table = profile_seq2seq(root / "s", 8, reps=1, execution_provider="cpu", intra_op_threads=1)
    runner = StageRunner(root / "s", execution_provider="cpu", intra_op_threads=1)
    spec = Seq2SeqSpec(runner.manifest)
    man = json.loads((root / "s" / "manifest.json").read_text())
    ref = Seq2SeqRunner(StageChain(root / "s", man, whole=False))
    return request.param, runner, spec, table, ref


def _reference(ref: Seq2SeqRunner, feeds: dict[str, np.ndarray], row: int) -> list[int]:
    tok = feeds["src_tokens"][row]
    src = np.zeros((1, ref.sec["max_source_length"]), np.int64)
    src[0, :tok.shape[0]] = tok
    limit = int(feeds["max_output_len"][row, 0]) if "max_output_len" in feeds else ref.sec["max_length"]
    ignore = "ignore_eos" in feeds and bool(feeds["ignore_eos"][row, 0])
    r = ref.start({"src_tokens": src, "src_len": np.array([tok.shape[0]], np.int64)})
    while r.phase != "done":
        ref.step([r])
        if r.phase == "done" and ignore and len(r.tokens) < limit:
            r.phase = "decoder"
    return r.tokens[:limit]


def test_validation_messages(split):
    _, _, spec, _, _ = split
    v = spec.vocab_size
    ok = {"src_tokens": np.array([[4, 5, 6]], np.int64)}
    assert spec.validate(ok, 8) == (1, None)
    cases = [
        ({"src_tokens": np.array([[4, v]], np.int64)}, f"token id {v} at row 0, position 1"),
        ({"src_tokens": np.zeros((1, spec.max_source_length + 1), np.int64)}, "source length"),
        ({"src_tokens": np.zeros((1, 0), np.int64)}, "source length 0"),
        ({**ok, "max_output_len": np.array([[spec.max_length + 1]], np.int64)}, "max_length"),
        ({**ok, "src_len": np.array([[4]], np.int64)}, "src_len"),
        ({**ok, "ignore_eos": np.ones((1, 1), np.bool_)}, "needs max_output_len"),
        ({**ok, "x": np.zeros((1, 1), np.float32)}, "unexpected input"),
        ({"src_len": np.ones((1, 1), np.int64)}, "missing input 'src_tokens'"),
        ({"src_tokens": np.zeros((9, 2), np.int64)}, "max_batch_size 8"),
        ({"src_tokens": np.zeros((1, 2), np.float32)}, "dtype float32"),
    ]
    for feeds, needle in cases:
        batch, err = spec.validate(feeds, 8)
        assert batch == 0 and err is not None and needle in err, (needle, err)


@pytest.mark.parametrize("policy", ["lazy", "graph:1", "serial"])
def test_runtime_matches_reference_with_staggered_arrivals(split, policy):
    kind, runner, spec, table, ref = split
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    pol = build_policy(parse_policy(policy), spec, table, max_batch_size=1 if policy == "serial" else 8,
                       dec_timesteps=None, coverage=0.9)
    answers: dict[int, tuple] = {}
    all_done = threading.Event()
    n = 10

    def respond(handle, outputs, status, error):
        answers[handle] = (outputs, status, error)
        if len(answers) == n:
            all_done.set()

    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec)
    rng = np.random.default_rng(17)
    requests = []
    for k in range(n):
        src_len = int(rng.integers(1, info.max_source_length + 1))
        out_len = int(rng.integers(1, info.max_output_length + 1))
        feeds = make_request(rng, info, src_len, out_len if k % 3 else None, batch=1 + k % 2,
                             ignore_eos=k % 3 == 1)
        assert spec.validate(feeds, 8)[1] is None
        requests.append(feeds)
        assert rt.submit(k, feeds, feeds["src_tokens"].shape[0], RequestOptions()) is None
        time.sleep(0.0005 * (k % 4))
    assert all_done.wait(60)
    rt.close()
    for k, feeds in enumerate(requests):
        outputs, status, error = answers[k]
        assert error is None
        for row in range(feeds["src_tokens"].shape[0]):
            want = _reference(ref, feeds, row)
            got = outputs["output_tokens"][row]
            assert int(outputs["output_len"][row, 0]) == len(want)
            assert got[:len(want)].tolist() == want and (got[len(want):] == -1).all()
    stats = rt.stats.as_dict()
    assert stats["answered"] == {"OK": n}
    assert stats["sched_s"] > 0 and stats["decoder_steps"] > 0  # one statistics object, scheduler time included
    assert stats["tokens"] == sum(int(o["output_len"].sum()) for o, _, _ in answers.values())  # padding makes none
    if policy.startswith("graph"):
        assert stats["padded_rows"] > 0  # finished rows rode along until the longest sequence of their batch ended
    if policy == "serial":
        assert set(stats["batch_hist"]) == {"1"} and stats["padded_rows"] == 0


def test_length_sampler_is_seeded_and_clipped():
    info = Seq2SeqInfo(8, 6, 50)
    s1, s2, s3 = LengthSampler(info, None, 3), LengthSampler(info, None, 3), LengthSampler(info, None, 4)
    d1 = [s1.draw() for _ in range(200)]
    assert d1 == [s2.draw() for _ in range(200)]
    assert d1 != [s3.draw() for _ in range(200)]
    assert all(1 <= s <= 8 and 1 <= o <= 6 for s, o in d1)
    assert len({s for s, _ in d1}) > 3 and len({o for _, o in d1}) > 3  # drawn, not constant


def test_spec_refuses_a_static_manifest(tmp_path: Path):
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.staging import make_mlp, split_model as cut

    mlp = make_mlp(tmp_path / "mlp.onnx", in_dim=4, width=8, depth=2, out_dim=2, seed=0)
    runner = StageRunner(cut(mlp, tmp_path / "st", cut_after=[]), execution_provider="cpu")
    with pytest.raises(ConfigError, match="no seq2seq section"):
        Seq2SeqSpec(runner.manifest)


def test_injected_fault_and_batch_log(split):
    """The seq2seq loop honours fault_injection like the base runtime (only the poisoned requests fail, with the
    injected error; the others get their reference output) and reports every stage run to the per-batch log."""
    kind, runner, spec, table, ref = split
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    pol = build_policy(parse_policy("lazy"), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    n, answers, done = 8, {}, threading.Event()
    logged: list[tuple[int, int, float]] = []

    def respond(handle, outputs, status, error):
        answers[handle] = (outputs, status, error)
        if len(answers) == n:
            done.set()

    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec, on_batch=lambda *a: logged.append(a))
    names = [st.name for st in runner.manifest.stages]
    rt.fault = FaultInjector.parse(f"stage={spec.dec_first},every=3", names)
    rng = np.random.default_rng(3)
    requests = [make_request(rng, info, 3, 4, batch=1, ignore_eos=True) for _ in range(n)]
    for k, feeds in enumerate(requests):
        assert rt.submit(k, feeds, 1, RequestOptions()) is None
    assert done.wait(60)
    rt.close()
    failed = {k for k, (_, _, err) in answers.items() if err is not None}
    assert failed and len(failed) < n  # every third sample is poisoned; the rest are served
    for k, (outputs, _, err) in answers.items():
        if k in failed:
            assert "injected fault" in err and outputs is None
        else:
            want = _reference(ref, requests[k], 0)
            assert outputs["output_tokens"][0][:len(want)].tolist() == want
    stages_logged = {st for st, _, _ in logged}
    assert {spec.dec_first, spec.dec_last} <= stages_logged
    assert all(b >= 1 and t >= 0 for _, b, t in logged)
    assert len(logged) == rt.stats.stage_runs


@pytest.mark.parametrize("factor, expect_above", [(0.05, True), (50.0, False)])
def test_runtime_recalibrates_the_table(split, factor, expect_above, monkeypatch):
    """Like the base runtime, the seq2seq loop rewrites the policy's latency table from the stage runs it observes
    (batcher/calibration.py), so that a table profiled alone does not make lazy admit work it cannot finish.
    (Rewrites are rate-limited in time, RECALIBRATE_INTERVAL_S: off here, for a run shorter than the interval.)"""
    from lazybatch.backend import runtime as runtime_module
    from lazybatch.batcher.latency_table import LatencyTable

    monkeypatch.setattr(runtime_module, "RECALIBRATE_INTERVAL_S", 0.0)

    kind, runner, spec, table, ref = split
    off = LatencyTable(table.graph, table.batch_sizes, [[v * factor for v in row] for row in table.measured],
                       meta=table.meta)
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    pol = build_policy(parse_policy("lazy"), spec, off, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    n, answers, done = 6, {}, threading.Event()

    def respond(handle, outputs, status, error):
        answers[handle] = error
        if len(answers) == n:
            done.set()

    rt = Seq2SeqRuntime(runner, off, pol, respond, spec=spec)
    before = sum(row[6] for row in off.dense)  # batch 6: the size these six sequences run at
    rng = np.random.default_rng(7)
    for k in range(n):
        assert rt.submit(k, make_request(rng, info, 3, 4, batch=1, ignore_eos=True), 1, RequestOptions()) is None
    assert done.wait(60)
    rt.close()
    assert all(err is None for err in answers.values())
    assert rt.calibrator.observations == rt.stats.stage_runs and pol.table is off
    if expect_above:  # the table said 20x faster than the stages ran
        assert rt.stats.time_scale > 3.0 and sum(row[6] for row in off.dense) > 3.0 * before
    else:  # the table said 50x slower: it comes down
        assert rt.stats.time_scale < 0.8 and sum(row[6] for row in off.dense) < 0.95 * before  # ~3 runs a stage
