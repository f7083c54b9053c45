"""The seq2seq runtime without a server: validation, the decoder loop against the reference runner, graph padding.

The real-server tests are tests/triton/test_seq2seq.py; these run the same runtime in-process (respond callback
instead of Triton response senders) so that a failure points at the loop, not at the server.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.faults import FaultInjector
from lazybatch.backend.seq2seq import Seq2SeqRuntime, Seq2SeqSpec, build_policy
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies import parse_policy
from lazybatch.client.seq2seq import LengthSampler, Seq2SeqInfo, make_request
from lazybatch.onnx_tools.seq2seq import Seq2SeqRunner
from lazybatch.onnx_tools.split import split_model
from lazybatch.onnx_tools.zoo import export_model
from lazybatch.repo import profile_seq2seq
from lazybatch.sessions.chain import StageChain


@pytest.fixture(scope="module", params=["gnmt", "transformer", "gpt2"])
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


def _assert_reference_answers(ref: Seq2SeqRunner, requests: list[dict[str, np.ndarray]],
                              answers: dict[int, tuple]) -> None:
    """Every request answered without error, each row the reference loop's tokens, padded with -1 after."""
    for k, feeds in enumerate(requests):
        outputs, _, error = answers[k]
        assert error is None
        for row in range(feeds["src_tokens"].shape[0]):
            want = _reference(ref, feeds, row)
            got = outputs["output_tokens"][row]
            assert int(outputs["output_len"][row, 0]) == len(want)
            assert got[:len(want)].tolist() == want and (got[len(want):] == -1).all()


def test_validation_messages(split):
    kind, _, spec, _, _ = split
    v = spec.vocab_size
    source = "prompt" if kind == "gpt2" else "source"  # a decoder-only model's errors speak of its prompt
    ok = {"src_tokens": np.array([[4, 5, 6]], np.int64)}
    assert spec.validate(ok, 8) == (1, None)
    cases = [
        ({"src_tokens": np.array([[4, v]], np.int64)}, f"token id {v} at row 0, position 1"),
        ({"src_tokens": np.zeros((1, spec.max_source_length + 1), np.int64)}, f"{source} length"),
        ({"src_tokens": np.zeros((1, 0), np.int64)}, f"{source} length 0"),
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
    _assert_reference_answers(ref, requests, answers)
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

    names = [st.name for st in runner.manifest.stages]
    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec, on_batch=lambda *a: logged.append(a),
                        fault=FaultInjector.parse(f"stage={spec.dec_first},every=3", names))
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
    from lazybatch.backend import table_keeper as keeper_module
    from lazybatch.batcher.latency_table import LatencyTable

    monkeypatch.setattr(keeper_module, "RECALIBRATE_INTERVAL_S", 0.0)

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
    # One request at a time, each answered before the next is sent: every stage then runs at least 6 times whatever
    # the machine's load (sent together and batched, an encoder stage ran only 3 times, and the calibrator's EMA,
    # weight 0.1 with each ratio clamped at 0.25, moves to 0.25 + 0.75 * 0.9**3 = 0.80 at most in 3 runs: a flake
    # on a busy machine); in 6 runs it is below 0.65, with any load.
    for k in range(n):
        assert rt.submit(k, make_request(rng, info, 3, 4, batch=1, ignore_eos=True), 1, RequestOptions()) is None
        end = time.monotonic() + 60
        while k not in answers:
            assert time.monotonic() < end, f"request {k} not answered in 60 s"
            time.sleep(0.005)
    assert done.wait(60)
    rt.close()
    assert all(err is None for err in answers.values())
    assert rt.calibrator.observations == rt.stats.stage_runs and pol.table is off
    assert min(sum(runs) for runs in rt.calibrator.runs) >= n, rt.calibrator.runs  # see above
    if expect_above:  # the table said 20x faster than the stages ran
        assert rt.stats.time_scale > 3.0 and sum(row[6] for row in off.dense) > 3.0 * before
    else:  # the table said 50x slower: it comes down
        assert rt.stats.time_scale < 0.8 and sum(row[6] for row in off.dense) < 0.95 * before  # ~3 runs a stage


def _run_wave(rt: Seq2SeqRuntime, requests: list[dict[str, np.ndarray]], first_handle: int, answers: dict,
              calls: list, *, together: bool) -> None:
    """Submit the requests (handles first_handle, first_handle + 1, ...) and wait for all their answers. together:
    the scheduler thread is held while they are queued, so that it admits them at once and their runs are batched
    (a poisoned sequence then fails a batched run first, and the rerun one by one must single it out)."""
    handles = range(first_handle, first_handle + len(requests))
    if together:
        rt.route.lock.acquire()
    try:
        for h, feeds in zip(handles, requests):
            assert rt.submit(h, feeds, feeds["src_tokens"].shape[0], RequestOptions()) is None
    finally:
        if together:
            rt.route.lock.release()
    end = time.monotonic() + 60
    while not all(h in answers for h in handles) and time.monotonic() < end:
        time.sleep(0.005)
    assert all(h in answers for h in handles)
    time.sleep(0.05)  # a second answer to any of them would have come by now
    assert len(calls) == len(set(calls)), "a request was answered twice"


@pytest.mark.parametrize("where", ["encoder", "decoder"])
@pytest.mark.parametrize("policy", ["lazy", "graph:1", "serial"])
def test_fault_fails_only_the_poisoned_sequences_and_is_counted(split, policy, where):
    """fault_injection on an encoder or a decoder stage of the seq2seq loop, as for static models: every third
    sequence (rows numbered in arrival order) fails, its request gets exactly one error that names the stage, every
    other request of the same batches and every later request gets the reference tokens, and the model's metrics
    count the failed stage runs (lazybatch_stage_failures_total) and the outcomes."""
    from lazybatch.backend import metrics as M

    kind, runner, spec, table, ref = split
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    names = [st.name for st in runner.manifest.stages]
    stage = spec.enc_stages[0] if where == "encoder" else spec.dec_stages[len(spec.dec_stages) // 2]
    pol = build_policy(parse_policy(policy), spec, table, max_batch_size=1 if policy == "serial" else 8,
                       dec_timesteps=None, coverage=0.9)
    answers: dict[int, tuple] = {}
    calls: list[int] = []

    def respond(handle, outputs, status, error):
        calls.append(handle)
        answers[handle] = (outputs, status, error)

    metrics = M.ModelMetrics("s2s", names, 8)  # the common families
    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec, metrics=metrics,
                        fault=FaultInjector.parse(f"stage={names[stage]},every=3", names))
    rng = np.random.default_rng(21)
    wave1 = [make_request(rng, info, int(rng.integers(1, 5)), 4, batch=2 if k == 4 else 1) for k in range(9)]
    wave2 = [make_request(rng, info, int(rng.integers(1, 5)), 3) for _ in range(4)]
    try:
        _run_wave(rt, wave1, 0, answers, calls, together=policy != "serial")
        _run_wave(rt, wave2, len(wave1), answers, calls, together=False)  # later requests: served as before
    finally:
        rt.close()
    # sequences are numbered in arrival order, one per row: request 4's second row is sequence 5
    poisoned, seq = set(), 0
    for h, feeds in enumerate(wave1 + wave2):
        for _ in range(feeds["src_tokens"].shape[0]):
            poisoned |= {h} if (seq + 1) % 3 == 0 else set()
            seq += 1
    assert poisoned == {2, 4, 7, 10}  # sequences 2, 5, 8 and 11
    for h, feeds in enumerate(wave1 + wave2):
        outputs, status, error = answers[h]
        if h in poisoned:
            assert outputs is None and status.name == "ERROR"
            assert f"stage {names[stage]!r} failed: InjectedFault: injected fault in stage {names[stage]!r}" in error
        else:
            assert error is None, error
            for row in range(feeds["src_tokens"].shape[0]):
                want = _reference(ref, feeds, row)
                assert outputs["output_tokens"][row][:len(want)].tolist() == want
    assert rt.stats.answered == {"OK": 13 - len(poisoned), "ERROR": len(poisoned)}
    assert metrics.requests[M.OK] == 13 - len(poisoned) and metrics.requests[M.ERROR] == len(poisoned)
    assert metrics.stage_failures[stage] >= len(poisoned)  # each poisoned sequence failed at least one run
    assert sum(metrics.stage_failures) == metrics.stage_failures[stage]


def test_transient_fault_in_a_decoder_step_is_invisible_to_clients(split):
    """mode=run: every second batched run of a decoder stage raises; the rerun one sequence at a time succeeds, so
    every request gets its reference tokens and only the failure counter shows it."""
    from lazybatch.backend import metrics as M

    kind, runner, spec, table, ref = split
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    names = [st.name for st in runner.manifest.stages]
    pol = build_policy(parse_policy("lazy"), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    answers: dict[int, tuple] = {}
    calls: list[int] = []

    def respond(handle, outputs, status, error):
        calls.append(handle)
        answers[handle] = (outputs, status, error)

    metrics = M.ModelMetrics("s2s", names, 8)  # the common families
    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec, metrics=metrics,
                        fault=FaultInjector.parse(f"stage={spec.dec_last},every=2,mode=run", names))
    rng = np.random.default_rng(4)
    requests = [make_request(rng, info, 2, 5) for _ in range(6)]
    try:
        _run_wave(rt, requests, 0, answers, calls, together=True)
    finally:
        rt.close()
    for h, feeds in enumerate(requests):
        outputs, _, error = answers[h]
        assert error is None, error
        assert outputs["output_tokens"][0].tolist() == _reference(ref, feeds, 0)
    assert metrics.stage_failures[spec.dec_last] > 0 and metrics.requests[M.ERROR] == 0
    # a failed batched step and its reruns are one decoder step: the steps counted are the steps that ran
    assert rt.stats.tokens == 6 * 5


@pytest.mark.parametrize("policy", ["lazy", "graph:1"])
def test_metrics_count_the_decoder_loop(split, policy):
    """The seq2seq model's metrics hold the common families (outcomes, per-stage batch sizes, decisions) and the
    decoder loop's own: decoder steps, mixed-timestep steps, tokens, sequences by end (eos / length) and graph
    padding, equal to the runtime's statistics; a static model's metrics have none of the loop's families. The end
    token is set to a token the model does make, so that some sequences end early at it."""
    from lazybatch.backend import metrics as M
    from lazybatch.formats.prometheus import parse_samples

    kind, runner, spec0, table, ref = split
    spec = Seq2SeqSpec(runner.manifest)  # a copy: the fixture's spec is shared
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    names = [st.name for st in runner.manifest.stages]
    rng = np.random.default_rng(8)
    requests = [make_request(rng, info, int(rng.integers(1, 6)), 6, ignore_eos=k % 2 == 0) for k in range(8)]
    full = [_reference(ref, {**f, "ignore_eos": np.ones((1, 1), np.bool_)}, 0) for f in requests]
    spec.end_token = full[1][1]  # request 1 stops at the end token: its second token
    want = []
    for f, toks in zip(requests, full):
        stop = "ignore_eos" not in f and spec.end_token in toks
        want.append((toks[:toks.index(spec.end_token) + 1] if stop else toks, stop))
    pol = build_policy(parse_policy(policy), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    answers: dict[int, tuple] = {}
    calls: list[int] = []

    def respond(handle, outputs, status, error):
        calls.append(handle)
        answers[handle] = (outputs, status, error)

    metrics = M.ModelMetrics("s2s", names, 8, seq2seq=True)
    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec, metrics=metrics)
    try:
        _run_wave(rt, requests, 0, answers, calls, together=True)
        rt.sync_metrics()  # the scheduler thread's decisions into the metrics (it does so at every idle moment)
    finally:
        rt.close()
    for h, (toks, _) in enumerate(want):
        outputs, _, error = answers[h]
        assert error is None and outputs["output_tokens"][0].tolist() == toks
    eos = sum(stop for _, stop in want)
    assert eos >= 1 and eos < len(want)
    text = metrics.to_prometheus()

    def total(family: str, **labels: str) -> float:
        return sum(v for lab, v in parse_samples(text, family) if all(lab.get(k) == w for k, w in labels.items()))

    stats = rt.stats
    assert total("lazybatch_requests_total", outcome="ok") == len(requests)
    assert total("lazybatch_decoder_steps_total") == stats.decoder_steps > 0
    assert total("lazybatch_mixed_timestep_steps_total") == stats.mixed_timestep_steps
    assert total("lazybatch_tokens_total") == stats.tokens == sum(len(t) for t, _ in want)
    assert total("lazybatch_sequences_total", end="eos") == stats.finished_eos == eos
    assert total("lazybatch_sequences_total", end="length") == stats.finished_length == len(want) - eos
    assert total("lazybatch_padded_rows_total") == stats.padded_rows
    if policy.startswith("graph"):
        assert stats.padded_rows > 0  # the early-ended sequence rode along
    assert total("lazybatch_decisions_total", kind="dispatch") > 0
    for name in (names[spec.enc_stages[0]], names[spec.dec_first], names[spec.dec_last]):
        assert total("lazybatch_stage_batch_size_count", stage=name) > 0
    assert total("lazybatch_stage_batch_size_count", stage=names[spec.dec_first]) == stats.decoder_steps

    static = M.ModelMetrics("mlp", ["s0"], 4)
    assert not set(M.SEQ2SEQ_FAMILIES) & set(static.family_names())
    assert set(M.SEQ2SEQ_FAMILIES) <= set(metrics.family_names())
    assert "lazybatch_tokens_total" not in static.to_prometheus()


def test_exporter_registers_the_seq2seq_families_only_for_seq2seq_models():
    """Triton's metric families are made from ModelMetrics.family_names(): the loop's families appear on the metrics
    port for a seq2seq model (with their values pushed), never for a static one."""
    from lazybatch.backend import metrics as M

    made: dict[str, dict] = {}

    class Metric:
        def __init__(self, family: str, labels: dict) -> None:
            self.key = (family, tuple(sorted(labels.items())))
            made.setdefault("values", {})[self.key] = 0.0

        def increment(self, v: float) -> None:
            made["values"][self.key] += v

        def set(self, v: float) -> None:
            made["values"][self.key] = v

    class PbUtils:
        class MetricFamily:
            COUNTER, GAUGE = 0, 1

            def __init__(self, name: str, description: str, kind: int) -> None:
                self.name = name
                made.setdefault("families", []).append(name)

            def Metric(self, labels: dict) -> Metric:
                return Metric(self.name, labels)

    static = M.TritonMetricsExporter(M.ModelMetrics("mlp", ["s0"], 4), PbUtils, interval_s=3600)
    static.close()
    assert not set(M.SEQ2SEQ_FAMILIES) & set(made["families"])
    made.clear()
    m = M.ModelMetrics("gnmt", ["enc", "dec"], 4, seq2seq=True)
    ex = M.TritonMetricsExporter(m, PbUtils, interval_s=3600)
    m.seq2seq_run(decoder_step=True, tokens=3, length=1, eos=2)
    ex.close()
    assert set(M.SEQ2SEQ_FAMILIES) <= set(made["families"])
    values = made["values"]
    pid = ("stub_pid", str(os.getpid()))  # every series names the instance's process (TritonMetricsExporter)
    assert values[("lazybatch_tokens_total", (("model", "gnmt"), pid))] == 3
    assert values[("lazybatch_sequences_total", (("end", "eos"), ("model", "gnmt"), pid))] == 2


@pytest.mark.parametrize("every", [1, 3])
def test_streaming_parts_concatenate_to_the_reference(split, every):
    """A decoupled model's parts: non-final ones with ``every`` new tokens in some row, one final; each row's parts
    joined are the sequential greedy decode, and a request whose only row ends sends just the final."""
    kind, runner, spec, table, ref = split
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    pol = build_policy(parse_policy("lazy"), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    parts: dict[int, list] = {}
    finals: dict[int, tuple] = {}
    n = 8
    all_done = threading.Event()

    def respond(handle, outputs, status, error, final=True):
        assert handle not in finals, "a part after the final answer"
        if final:
            finals[handle] = (outputs, status, error)
            if len(finals) == n:
                all_done.set()
        else:
            parts.setdefault(handle, []).append(outputs)

    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec, stream_every=every)
    rng = np.random.default_rng(3)
    requests = []
    for k in range(n):
        out_len = 1 if k == 0 else int(rng.integers(2, info.max_output_length + 1))
        feeds = make_request(rng, info, int(rng.integers(1, info.max_source_length + 1)), out_len,
                             batch=1 + k % 2, ignore_eos=True)
        requests.append(feeds)
        assert rt.submit(k, feeds, feeds["src_tokens"].shape[0], RequestOptions()) is None
    assert all_done.wait(60)
    rt.close()
    assert 0 not in parts  # one token: the final answer carries it, nothing is streamed before
    for k, feeds in enumerate(requests):
        outputs, status, error = finals[k]
        assert error is None
        got = [[] for _ in range(feeds["src_tokens"].shape[0])]
        for p in parts.get(k, []) + [outputs]:
            assert p["output_len"].max() >= (every if p is not outputs else 1)
            for row, toks in enumerate(got):
                n_new = int(p["output_len"][row, 0])
                toks.extend(p["output_tokens"][row, :n_new].tolist())
                assert (p["output_tokens"][row, n_new:] == -1).all()
        for row, toks in enumerate(got):
            assert toks == _reference(ref, feeds, row), (k, row)
        if int(feeds["max_output_len"].max()) > every:
            assert parts.get(k), f"request {k} ({feeds['max_output_len'].ravel()} tokens) streamed nothing"
    stats = rt.stats.as_dict()
    assert stats["streamed"] == sum(len(v) for v in parts.values())
    # server-side time to the first part: one per request that streamed one, after its hand-off
    assert stats["first_part"]["n"] == len(parts) and 0 < stats["first_part"]["p50_ms"] <= stats["first_part"]["max_ms"]
    assert 0 <= stats["admit_wait_mean_ms"] <= stats["admit_wait_max_ms"]


def test_decoupled_configs_are_checked(tmp_path):
    """--decoupled streams tokens: refused with a reason for a model without a decoder loop, for Triton's whole-graph
    policy, and a stream interval needs a decoupled model and at least one token."""
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.repo import add_model

    export_model("gpt2", tmp_path / "g.onnx", small=True)
    mdir = add_model(tmp_path / "g.onnx", tmp_path / "repo", name="g", policy="eager", execution_provider="cpu",
                     profile_reps=1, decoupled=True, stream_interval_tokens=2)
    cfg = parse_config_text((mdir / "config.pbtxt").read_text())
    settings = BackendSettings.from_config(cfg, mdir / "1")
    assert settings.decoupled and settings.stream_interval_tokens == 2
    # cancellation asks share the streamed parts' path: a decoupled model asks every 100 ms unless told otherwise
    assert settings.cancel_poll_ms == 100.0
    cfg.parameters["cancel_poll_ms"].string_value = "20"
    assert BackendSettings.from_config(cfg, mdir / "1").cancel_poll_ms == 20.0
    cfg.parameters["cancel_poll_ms"].string_value = "auto"
    assert BackendSettings.from_config(cfg, mdir / "1").cancel_poll_ms == 100.0
    cfg.parameters["stream_interval_tokens"].string_value = "0"
    with pytest.raises(ConfigError, match="stream_interval_tokens must be at least 1"):
        BackendSettings.from_config(cfg, mdir / "1")
    cfg.parameters["stream_interval_tokens"].string_value = "1"
    cfg.parameters["policy"].string_value = "whole_graph"
    with pytest.raises(ConfigError, match="decoupled model .* needs a scheduler policy"):
        BackendSettings.from_config(cfg, mdir / "1")
    with pytest.raises(ConfigError, match="applies to a --decoupled model"):
        add_model(tmp_path / "g.onnx", tmp_path / "repo", name="h", execution_provider="cpu", profile_reps=1,
                  stream_interval_tokens=2)
    export_model("mobilenet_v1", tmp_path / "m.onnx", small=True)
    with pytest.raises(ConfigError, match="--decoupled streams generated tokens"):
        add_model(tmp_path / "m.onnx", tmp_path / "repo", name="m", execution_provider="cpu", profile_reps=1,
                  decoupled=True)
    assert not (tmp_path / "repo" / "m").exists() and not (tmp_path / "repo" / "h").exists()


def test_eager_predicts_decode_lengths_from_the_models_histogram(split, tmp_path):
    """Eager's admission (batcher/decode_admission.py) conditions each row's predicted length on its progress, from
    the length histogram the table was profiled with (the shipped one the model names: chat for the LM, the
    WMT-like one by default); a table whose histogram file is gone falls back to the shipped one, and a policy
    given dec_timesteps keeps it fixed."""
    from lazybatch.batcher.lengths import LengthHistogram
    from lazybatch.formats.histograms import shipped_histogram

    kind, runner, spec, table, ref = split
    hist = LengthHistogram.load(table.meta["length_histogram"])
    assert hist.to_dict() == LengthHistogram.load(shipped_histogram(spec.length_histogram)).to_dict()
    pol = build_policy(parse_policy("eager"), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    Seq2SeqRuntime(runner, table, pol, lambda *a: None, spec=spec).close()
    lengths = pol.decoder.curves.lengths
    assert pol.dec_timesteps == lengths.target(0) == hist.coverage_length(0.9)
    assert lengths.target(pol.dec_timesteps) == hist.conditional_length(pol.dec_timesteps, 0.9) > pol.dec_timesteps
    assert lengths.lost_block == (kind != "gpt2")  # WMT-like lengths vary little; the LM's chat lengths do

    moved = LatencyTable.from_dict(table.to_dict())
    moved.meta["length_histogram"] = str(tmp_path / "gone.json")
    pol = build_policy(parse_policy("eager"), spec, moved, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    Seq2SeqRuntime(runner, moved, pol, lambda *a: None, spec=spec).close()
    assert pol.decoder.curves.lengths.target(0) == hist.coverage_length(0.9)

    pol = build_policy(parse_policy("eager:dec_timesteps=5"), spec, table, max_batch_size=8, dec_timesteps=None,
                       coverage=0.9)
    Seq2SeqRuntime(runner, table, pol, lambda *a: None, spec=spec).close()
    assert pol.decoder.curves.lengths.target(0) == 5 and pol.decoder.curves.lengths.target(7) == 8


def test_decoupled_models_default_to_first_token_admission(split):
    """A decoupled model's eager admits up to the batch cap (its users weigh the first token); a policy that names
    its admission keeps it, and a model that answers once keeps the curves."""
    kind, runner, spec, table, ref = split
    def admission(text: str, decoupled: bool) -> str:
        return build_policy(parse_policy(text), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9,
                            decoupled=decoupled).admission

    assert admission("eager", True) == "first_token"
    assert admission("eager", False) == "curves"
    assert admission("eager:admission=curves", True) == "curves"
    assert not hasattr(build_policy(parse_policy("lazy"), spec, table, max_batch_size=8, dec_timesteps=None,
                                    coverage=0.9, decoupled=True), "admission")


@pytest.mark.parametrize("policy", ["lazy", "graph:1"])
def test_device_resident_loop_answers_as_the_reference(split, policy):
    """The decoder loop on the device-resident path (device_tensors, CPU provider): carried state stays an OrtValue
    between steps, rows of different timesteps join on the device, graph batching pads there, and only the step's
    tokens come to the host; every answer is the reference loop's."""
    from lazybatch.sessions.device_tensors import DeviceTensors

    kind, host_runner, spec, table, ref = split
    runner = StageRunner(host_runner.dir, execution_provider="cpu", intra_op_threads=1, device_tensors=True)
    assert isinstance(runner.resident, DeviceTensors), runner.resident_refused  # the load-time check passed
    info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
    pol = build_policy(parse_policy(policy), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    n, answers, done = 8, {}, threading.Event()

    def respond(handle, outputs, status, error):
        answers[handle] = (outputs, status, error)
        if len(answers) == n:
            done.set()

    rt = Seq2SeqRuntime(runner, table, pol, respond, spec=spec)
    rng = np.random.default_rng(23)
    requests = [make_request(rng, info, int(rng.integers(1, info.max_source_length + 1)),
                             int(rng.integers(1, info.max_output_length + 1)), batch=1 + k % 2, ignore_eos=True)
                for k in range(n)]
    for k, feeds in enumerate(requests):
        assert rt.submit(k, feeds, feeds["src_tokens"].shape[0], RequestOptions()) is None
        time.sleep(0.0005 * (k % 3))
    assert done.wait(60)
    rt.close()
    _assert_reference_answers(ref, requests, answers)
    assert runner.resident.uploads > 0 and runner.resident.concats > 0  # joined on the device, not through numpy
    if policy.startswith("graph"):
        assert rt.stats.as_dict()["padded_rows"] > 0
