"""Seq2seq models (small GNMT and Transformer exports) through a real Triton server: the backend's decoder loop.

Served tokens must equal the reference runner's (``Seq2SeqRunner`` on the same stages) for concurrent requests of
different source and output lengths under lazy, graph, serial and Triton's own batcher (triton:0); decoder steps of requests at different timesteps
must really share batches; a bad request gets its own clear error while the others succeed.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lazybatch.backend.stats_logs import read_log
from lazybatch.batcher.errors import ConfigError
from lazybatch.cli import main
from lazybatch.client.api import Client, InferError
from lazybatch.client.seq2seq import LengthSampler, Seq2SeqInfo, info_from_parameters, make_request
from lazybatch.client.soak import metric_total, scrape, wait_for
from lazybatch.formats.prometheus import parse_samples
from lazybatch.onnx_tools.seq2seq import Seq2SeqRunner
from lazybatch.onnx_tools.split import split_model
from lazybatch.onnx_tools.zoo import export_model
from lazybatch.repo import add_model
from lazybatch.serving import TritonServer, free_port
from lazybatch.sessions.chain import StageChain

KINDS = ("gnmt", "transformer", "gpt2")
# triton: Triton's own dynamic batcher forms the batches, the backend decodes each to its end in one execute
POLICIES = {"lazy": "lazy", "graph": "graph:2", "serial": "serial", "triton": "triton:0"}
MAX_BATCH = 8
FAULT_KIND, FAULT_MODEL = "gnmt", "gnmt_fault"
FAULT_STAGE = "stage_004"  # a decoder stage of the small GNMT (encoder steps 0-1, decoder steps 2-6)
# decoupled models that stream their tokens: (kind, policy, tokens per response)
STREAMED = {"gpt2_stream": ("gpt2", "eager", 1), "transformer_stream_triton": ("transformer", "triton:0", 3)}


class Seq2SeqServed:
    def __init__(self, server: TritonServer, root: Path, stats_dir: Path) -> None:
        self.server = server
        self.root = root
        self.stats_dir = stats_dir
        self.refs: dict[str, Seq2SeqRunner] = {}
        self.info: dict[str, Seq2SeqInfo] = {}

    @property
    def grpc(self) -> str:
        return self.server.endpoints.grpc

    def stats(self, model: str, settle: float = 10.0) -> dict[str, Any]:
        """The backend's statistics file, once it stopped changing (it is rewritten whenever the model goes idle)."""
        path = self.stats_dir / f"{model}.json"
        end, last = time.monotonic() + settle, None
        while time.monotonic() < end:
            try:
                data = json.loads(path.read_text()) if path.exists() else {}
            except ValueError:
                data = None
            if data is not None and data == last:
                return data
            last = data
            time.sleep(0.3)
        raise AssertionError(f"statistics of {model} did not settle")

    def expected(self, kind: str, feeds: dict[str, np.ndarray]) -> list[list[int]]:
        """The reference runner, row by row: greedy decoding until the end token or the length limit."""
        runner = self.refs[kind]
        sec = runner.sec
        tok = feeds["src_tokens"]
        out = []
        for i in range(tok.shape[0]):
            n = int(feeds["src_len"][i, 0]) if "src_len" in feeds else tok.shape[1]
            src = np.zeros((1, sec["max_source_length"]), np.int64)
            src[0, :tok.shape[1]] = tok[i]
            limit = int(feeds["max_output_len"][i, 0]) if "max_output_len" in feeds else sec["max_length"]
            ignore = "ignore_eos" in feeds and bool(feeds["ignore_eos"][i, 0])
            r = runner.start({"src_tokens": src, "src_len": np.array([n], np.int64)})
            while r.phase != "done":
                runner.step([r])
                if r.phase == "done" and ignore and len(r.tokens) < limit:
                    r.phase = "decoder"  # the runner stops at the end token; this request asked to go on
            out.append(r.tokens[:limit])
        return out


@pytest.fixture(scope="module")
def s2s(tmp_path_factory: pytest.TempPathFactory) -> Seq2SeqServed:
    root = tmp_path_factory.mktemp("seq2seq")
    repo = root / "model_repository"
    refs, infos = {}, {}
    for kind in KINDS:
        export_model(kind, root / f"{kind}.onnx", small=True, seed=3)
        stages = root / f"{kind}_stages"
        split_model(root / f"{kind}.onnx", stages)
        table = None
        for pol, spec in POLICIES.items():
            # profiled as the median of 3 runs: one stalled run on a busy machine is dropped
            add_model(None, repo, name=f"{kind}_{pol}", policy=spec, sla_ms=2000, max_batch_size=MAX_BATCH,
                      stages=stages, latency_table=table, profile_reps=3, execution_provider="cpu",
                      intra_op_threads=1)
            table = repo / f"{kind}_{pol}" / "1" / "latency.json"  # profiled once, shared by the others
        if kind == FAULT_KIND:  # every third sequence fails in a decoder stage (test_fault_injection_...)
            add_model(None, repo, name=FAULT_MODEL, policy="lazy", sla_ms=2000, max_batch_size=MAX_BATCH,
                      stages=stages, latency_table=table, execution_provider="cpu", intra_op_threads=1,
                      parameters={"fault_injection": f"stage={FAULT_STAGE},every=3", "metrics_interval_ms": "100"})
        for name, (k, pol, every) in STREAMED.items():
            if k == kind:
                add_model(None, repo, name=name, policy=pol, sla_ms=2000, max_batch_size=MAX_BATCH, stages=stages,
                          latency_table=table, execution_provider="cpu", intra_op_threads=1, decoupled=True,
                          stream_interval_tokens=every)
        man = json.loads((stages / "manifest.json").read_text())
        refs[kind] = Seq2SeqRunner(StageChain(stages, man, whole=False))
        sec = man["seq2seq"]
        infos[kind] = Seq2SeqInfo(sec["max_source_length"], sec["max_length"],
                                  man["inputs"][0]["range"][1] + 1)
    stats_dir = root / "stats"
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / "tritonserver.log",
                          env={"LAZYBATCH_STATS_DIR": str(stats_dir), "OMP_NUM_THREADS": "1"})
    server.start(timeout=240)
    served = Seq2SeqServed(server, root, stats_dir)
    served.refs, served.info = refs, infos
    try:
        yield served
    finally:
        assert server.stop() == 0, f"tritonserver failed; see {root / 'tritonserver.log'}"


def _request(rng: np.random.Generator, info: Seq2SeqInfo, k: int) -> dict[str, np.ndarray]:
    """Different source lengths, output limits, EOS handling and batch sizes (rows padded, with src_len)."""
    src_len = int(rng.integers(1, info.max_source_length + 1))
    kind = k % 4
    if kind == 0:  # decode until the end token or the model's max_length
        return make_request(rng, info, src_len, None)
    if kind == 1:  # at most n tokens, stopping at the end token
        return make_request(rng, info, src_len, int(rng.integers(1, info.max_output_length + 1)), ignore_eos=False)
    if kind == 2:  # exactly n tokens
        return make_request(rng, info, src_len, int(rng.integers(1, info.max_output_length + 1)))
    feeds = make_request(rng, info, src_len, int(rng.integers(2, info.max_output_length + 1)), batch=3)
    feeds["src_len"] = np.array([[src_len], [max(1, src_len - 2)], [1]], np.int64)  # rows of different lengths
    feeds["max_output_len"][1, 0] = 1
    return feeds


def _check(served: Seq2SeqServed, kind: str, feeds: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
    want = served.expected(kind, feeds)
    lens = out["output_len"].reshape(-1).tolist()
    assert lens == [len(t) for t in want]
    toks = out["output_tokens"]
    assert toks.shape == (len(want), max(lens))
    for row, w in zip(toks, want):
        assert row[:len(w)].tolist() == w
        assert (row[len(w):] == -1).all()


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_requests_match_reference_runner(s2s, kind, policy):
    model = f"{kind}_{policy}"
    info = s2s.info[kind]
    before = s2s.stats(model)

    def client(k: int) -> int:
        rng = np.random.default_rng(1000 + k)
        with Client(s2s.grpc) as c:
            for j in range(3):
                feeds = _request(rng, info, k + j)
                _check(s2s, kind, feeds, c.infer(model, feeds))
        return 3

    with ThreadPoolExecutor(12) as pool:
        assert sum(pool.map(client, range(12))) == 36
    after = s2s.stats(model)
    assert after["answered"].get("OK", 0) - before.get("answered", {}).get("OK", 0) == 36
    if policy != "serial":
        assert max(int(b) for b in after["batch_hist"]) > 1, (after["scheduler"], after["batch_hist"])
    else:
        assert set(after["batch_hist"]) == {"1"}
    if policy in ("graph", "triton"):
        assert after["padded_rows"] > 0  # finished sequences rode along until the longest ended
    if policy == "triton":  # never a step of requests at different timesteps: a batch is decoded to its end
        assert after.get("mixed_timestep_steps", 0) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_decoder_steps_at_different_timesteps_share_a_batch(s2s, kind):
    """Requests arriving while others decode join their decoder steps (LazyBatching merges sub-batches at the
    same stage whatever their timestep). Timing decides which steps mix: rounds of arrivals one after another, short
    sources (so that the next arrival finds the previous request decoding), until one round shows it."""
    model = f"{kind}_lazy"
    info = s2s.info[kind]
    base = s2s.stats(model).get("mixed_timestep_steps", 0)
    mixed = 0
    clients = [Client(s2s.grpc) for _ in range(8)]
    try:
        for c in clients:  # connected before the round starts, so that send times are what the round says
            c.model_info(model)
        for rnd in range(30):  # usually the first or second round; a failing backend never mixes
            rng = np.random.default_rng(50 + rnd)
            feeds = [make_request(rng, info, int(rng.integers(1, 3)), info.max_output_length) for _ in clients]
            delays = np.arange(len(clients)) * (0.0005, 0.001, 0.002, 0.003)[rnd % 4]  # one arrival after another
            start = threading.Barrier(len(clients))

            def client(k: int) -> None:
                start.wait()
                time.sleep(delays[k])
                _check(s2s, kind, feeds[k], clients[k].infer(model, feeds[k]))

            with ThreadPoolExecutor(len(clients)) as pool:
                list(pool.map(client, range(len(clients))))
            stats = s2s.stats(model)
            mixed = stats["mixed_timestep_steps"] - base
            if mixed > 0:
                print(f"{kind}: decoder steps at different timesteps shared a batch in round {rnd + 1}")
                break
    finally:
        for c in clients:
            c.close()
    assert mixed > 0, (stats["scheduler"], stats["batch_hist"])
    assert stats["max_timestep_spread"] >= 1


BAD = {
    "token id above the vocabulary": (lambda i: {"src_tokens": np.array([[5, i.vocab_size]], np.int64)},
                                      "outside the vocabulary"),
    "negative token id": (lambda i: {"src_tokens": np.array([[-1, 4]], np.int64)}, "outside the vocabulary"),
    "source too long": (lambda i: {"src_tokens": np.full((1, i.max_source_length + 1), 4, np.int64)},
                        "length"),
    "empty source": (lambda i: {"src_tokens": np.zeros((1, 0), np.int64)}, "length 0 is out of range"),
    "output length zero": (lambda i: {"src_tokens": np.full((1, 3), 4, np.int64),
                                      "max_output_len": np.zeros((1, 1), np.int64)}, "max_output_len"),
    "output length above the model's": (lambda i: {"src_tokens": np.full((1, 3), 4, np.int64),
                                                   "max_output_len": np.array([[i.max_output_length + 1]])},
                                        "max_length"),
    "src_len above the tokens sent": (lambda i: {"src_tokens": np.full((1, 3), 4, np.int64),
                                                 "src_len": np.array([[4]], np.int64)}, "src_len"),
    "ignore_eos without a length": (lambda i: {"src_tokens": np.full((1, 3), 4, np.int64),
                                               "ignore_eos": np.ones((1, 1), np.bool_)}, "needs max_output_len"),
    "batch above max": (lambda i: {"src_tokens": np.full((MAX_BATCH + 1, 3), 4, np.int64)}, "batch"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_bad_requests_get_clear_errors_while_others_succeed(s2s, kind):
    model = f"{kind}_lazy"
    info = s2s.info[kind]
    cases = sorted(BAD) * 2
    good_rng = np.random.default_rng(9)
    goods = [_request(good_rng, info, k) for k in range(len(cases))]

    def bad(k: int) -> str:
        feeds, _ = BAD[cases[k]]
        with Client(s2s.grpc) as c:
            with pytest.raises(InferError) as e:
                c.infer(model, {n: np.asarray(v, np.int64) if v.dtype.kind == "i" else v
                                for n, v in feeds(info).items()})
        return str(e.value)

    def good(k: int) -> None:
        with Client(s2s.grpc) as c:
            _check(s2s, kind, goods[k], c.infer(model, goods[k]))

    with ThreadPoolExecutor(16) as pool:
        goods_done = [pool.submit(good, k) for k in range(len(goods))]
        bads = list(pool.map(bad, range(len(cases))))
        for f in goods_done:
            f.result()
    for case, msg in zip(cases, bads):
        assert BAD[case][1].lower() in msg.lower(), (case, msg)


def test_infer_and_load_cli_drive_a_seq2seq_model(s2s, tmp_path, capsys):
    info = s2s.info["transformer"]
    rc = main(["infer", "transformer_lazy", "--url", s2s.grpc, "--src-len", "5", "--max-output-len", "4",
               "--ignore-eos", "--seed", "4", "--batch", "2"])
    assert rc == 0
    out = capsys.readouterr().out
    feeds = make_request(np.random.default_rng(4), info, 5, 4, batch=2)
    want = s2s.expected("transformer", feeds)
    assert json.dumps({"output_tokens": want}) in out and json.dumps({"output_len": [[4], [4]]}) in out

    before = s2s.stats("gnmt_lazy")
    rc = main(["load", "gnmt_lazy", "--url", s2s.grpc, "--rate", "40", "--duration", "1.5", "--sla-ms", "500",
               "--seed", "11", "--out", str(tmp_path / "load")])
    assert rc == 0
    row = json.loads((tmp_path / "load" / "load.json").read_text())[0]
    assert row["sent"] > 10 and row["errors"] == 0 and row["ok"] == row["sent"]
    after = s2s.stats("gnmt_lazy")
    # every request decoded exactly its drawn output length (plus the one-token warm-up request)
    sampler = LengthSampler(s2s.info["gnmt"], None, 11)
    drawn = [sampler.draw() for _ in range(row["sent"])]
    assert after["tokens"] - before.get("tokens", 0) == sum(o for _, o in drawn) + 1
    assert len({s for s, _ in drawn}) > 1 and len({o for _, o in drawn}) > 1


def test_repo_add_serves_seq2seq_under_tritons_batcher_a_batch_per_execute(tmp_path):
    """triton:<us> on a seq2seq model: Triton's dynamic_batching with that delay forms the batches; the backend
    decodes each group to its end (graph:0, batch_per_execute) before execute returns."""
    from lazybatch.backend.config_pbtxt import parse_config_text

    export_model("gnmt", tmp_path / "g.onnx", small=True)
    add_model(tmp_path / "g.onnx", tmp_path / "repo", name="g", policy="triton:5000", execution_provider="cpu",
              profile_reps=1)
    cfg = parse_config_text((tmp_path / "repo" / "g" / "config.pbtxt").read_text())
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 5000
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["batch_per_execute"] == "true" and params["policy"] == "graph:0"
    ragged = {i.name: i.allow_ragged_batch for i in cfg.input}
    assert ragged == {"src_tokens": True, "src_len": False, "max_output_len": False, "ignore_eos": False}


@pytest.mark.parametrize("kind", KINDS)
def test_tritons_batcher_groups_sources_of_different_lengths(s2s, kind):
    """Triton's dynamic batcher groups only requests of one shape unless the input allows ragged batches; without
    it (before this test) sources of different lengths never shared a batch under triton:<us>, and Triton's batcher
    lost to lazybatch by a margin that was the config's, not the batcher's. One long request runs; requests of six
    different source lengths queue meanwhile (or arrive with it) and are decoded in one batch, each to its own
    reference tokens."""
    model = f"{kind}_triton"
    info = s2s.info[kind]
    rng = np.random.default_rng(7)
    before = s2s.stats(model)
    # seven source lengths, all different (the long one the longest), so that any batch of two or more holds
    # sources of different lengths: the small models decode in a few ms, and on a busy machine the queued requests
    # can miss the long one and come in pairs (CI once saw batches of 1 and 2 only, so "3 or more" was flaky)
    long = make_request(rng, info, info.max_source_length, info.max_output_length)
    queued = [make_request(rng, info, 1 + i % (info.max_source_length - 1), 2) for i in range(6)]
    with Client(s2s.grpc) as c, ThreadPoolExecutor(7) as pool:
        # the long request goes first; the others queue while it decodes (a sleep here once outlasted the decode on
        # a busy machine: they then arrived one by one and were served so). Should some arrive with it, Triton's
        # batcher groups them with it: sources of different lengths in one batch either way.
        first = pool.submit(c.infer, model, long)
        futs = {i: pool.submit(c.infer, model, f) for i, f in enumerate(queued)}
        got = {i: f.result(timeout=120) for i, f in futs.items()}
        _check(s2s, kind, long, first.result(timeout=120))
    for i, feeds in enumerate(queued):
        _check(s2s, kind, feeds, got[i])
    assert len({f["src_tokens"].shape[1] for f in [long, *queued]}) == 7
    after = s2s.stats(model)
    grown = {int(b) for b, n in after["batch_hist"].items() if n > before.get("batch_hist", {}).get(b, 0)}
    assert max(grown) >= 2, (before.get("batch_hist"), after["batch_hist"])


def test_batch_per_execute_needs_graph_policy(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text

    export_model("gnmt", tmp_path / "g.onnx", small=True)
    add_model(tmp_path / "g.onnx", tmp_path / "repo", name="g", policy="triton:0", execution_provider="cpu",
              profile_reps=1)
    cfg = parse_config_text((tmp_path / "repo" / "g" / "config.pbtxt").read_text())
    cfg.parameters["policy"].string_value = "lazy"
    with pytest.raises(ConfigError, match="batch_per_execute .* needs policy graph:0"):
        BackendSettings.from_config(cfg, tmp_path / "repo" / "g" / "1")


def _perf(s2s: Seq2SeqServed, model: str, rate: int, ms: int, out: Path) -> tuple[str, dict[str, Any]]:
    """`lazybatch perf` on one model at one rate: its log (checked for errors) and the model's statistics before."""
    before = s2s.stats(model)
    rc = main(["perf", model, "--url", s2s.grpc, "--rates", str(rate), "--measurement-ms", str(ms),
               "--out", str(out), "--stability-percentage", "500", "--seed", "2"])
    assert rc == 0
    log = (out / f"perf_{model}.log").read_text()
    assert "error" not in log.lower().replace("standard deviation", "")
    return log, before


def test_perf_analyzer_against_a_seq2seq_model_reports_no_errors(s2s, tmp_path):
    """`lazybatch perf` gives perf_analyzer a JSON of valid requests (drawn lengths) instead of random data."""
    out = tmp_path / "perf"
    log, before = _perf(s2s, "transformer_lazy", 20, 1500, out)
    assert f"--input-data {out / 'input_transformer_lazy.json'}" in log
    data = json.loads((out / "input_transformer_lazy.json").read_text())["data"]
    assert len({len(d["src_tokens"]["content"]) for d in data}) > 1
    rows = json.loads((out / "perf.json").read_text())
    assert rows[0]["throughput"] > 5
    after = s2s.stats("transformer_lazy")
    assert after["answered"].get("OK", 0) > before.get("answered", {}).get("OK", 0)
    assert after["answered"].get("INTERNAL", 0) == before.get("answered", {}).get("INTERNAL", 0)


def test_fault_injection_metrics_and_batch_log_on_a_seq2seq_model(s2s):
    """fault_injection, metrics and the batch log as for static models. gnmt_fault poisons every third sequence in a
    decoder stage: under 12 concurrent clients exactly those requests get one error each that names the stage, the
    others (sharing their decoder steps) the reference runner's tokens; later requests one after the other are
    served the same way. The metrics port shows the common lazybatch_* families for the model (outcomes, stage
    failures, batch sizes) and the decoder loop's (steps, tokens, sequences by end), equal to what the clients got,
    and the batch log holds encoder-step and decoder-step batches."""
    model, kind = FAULT_MODEL, FAULT_KIND
    info = s2s.info[kind]
    url = s2s.server.endpoints.metrics
    before_stats = s2s.stats(model)
    base = before_stats.get("samples", 0)  # sequences numbered so far (one per row, in arrival order)
    before = scrape(url)
    rng = np.random.default_rng(77)
    burst = [make_request(rng, info, int(rng.integers(1, info.max_source_length + 1)),
                          int(rng.integers(2, info.max_output_length + 1)), ignore_eos=k % 2 == 0) for k in range(12)]
    later = [make_request(rng, info, 3, 4) for _ in range(6)]

    def call(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | str:
        with Client(s2s.grpc) as c:
            try:
                return c.infer(model, feeds)
            except InferError as e:
                return str(e)

    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(call, burst))
    failed = [g for g in got if isinstance(g, str)]
    # the backend numbers sequences in arrival order, which under concurrency need not be the send order: count them
    assert len(failed) == 4, failed
    got_later = [call(f) for f in later]  # one after the other: sequences base + 12 + j, in this order
    for j, g in enumerate(got_later):
        assert isinstance(g, str) == ((base + 12 + j + 1) % 3 == 0), (j, g)
    ok_feeds, ok_out = [], []
    for feeds, g in zip(burst + later, got + got_later):
        if isinstance(g, str):
            assert f"stage '{FAULT_STAGE}' failed" in g and f"injected fault in stage '{FAULT_STAGE}'" in g, g
        else:
            _check(s2s, kind, feeds, g)
            ok_feeds.append(feeds)
            ok_out.append(g)
    n_failed = len(burst) + len(later) - len(ok_out)
    after_stats = s2s.stats(model)
    answered = {k: v - before_stats.get("answered", {}).get(k, 0) for k, v in after_stats["answered"].items()}
    assert answered == {"OK": len(ok_out), "ERROR": n_failed}  # exactly one answer each, on the server's side too

    tokens = sum(int(o["output_len"].sum()) for o in ok_out)
    end = s2s.refs[kind].sec["end_token_id"]
    eos = sum(1 for f, o in zip(ok_feeds, ok_out) if "ignore_eos" not in f
              and o["output_tokens"][0, int(o["output_len"][0, 0]) - 1] == end)

    def delta(text: str, family: str, **labels: str) -> float:
        return metric_total(text, family, model=model, **labels) - metric_total(before, family, model=model, **labels)

    assert wait_for(lambda: delta(scrape(url), "lazybatch_tokens_total") == tokens
                    and delta(scrape(url), "lazybatch_requests_total", outcome="error") == n_failed, 15), \
        [line for line in scrape(url).splitlines() if model in line and ("tokens" in line or "requests" in line)]
    text = scrape(url)
    assert delta(text, "lazybatch_requests_total", outcome="ok") == len(ok_out)
    assert delta(text, "lazybatch_stage_failures_total", stage=FAULT_STAGE) >= n_failed
    assert delta(text, "lazybatch_stage_failures_total") == delta(text, "lazybatch_stage_failures_total",
                                                                  stage=FAULT_STAGE)
    assert delta(text, "lazybatch_stage_batch_size_count", stage="stage_000") > 0  # encoder steps
    assert delta(text, "lazybatch_decoder_steps_total") == after_stats["decoder_steps"] - \
        before_stats.get("decoder_steps", 0) > 0
    assert delta(text, "lazybatch_sequences_total", end="eos") == eos
    assert delta(text, "lazybatch_sequences_total", end="length") == len(ok_out) - eos
    assert delta(text, "lazybatch_decisions_total", kind="dispatch") > 0
    assert "# TYPE lazybatch_decoder_steps_total counter" in text
    series = [lab for lab, _ in parse_samples(text, "lazybatch_tokens_total") if lab.get("model") == f"{kind}_lazy"]
    assert len(series) == 1 and series[0]["stub_pid"].isdigit(), series  # one instance, labelled with its process

    # the batch log (LAZYBATCH_STATS_DIR/<model>.batches.csv): encoder-step and decoder-step batches
    rows = read_log(s2s.stats_dir / f"{model}.batches.csv")
    stages = {int(r[1]) for r in rows}
    assert {0, 1} <= stages and {2, 6} <= stages, stages
    assert sum(int(r[2]) for r in rows if int(r[1]) == 6) >= tokens  # a token per row of each last decoder stage run


def _stream_all(url: str, model: str, requests: list[dict[str, np.ndarray]]) -> list[Any]:
    """Every request on its own gRPC stream, all at once."""
    import asyncio

    from lazybatch.client.stream import StreamClient

    async def go() -> list[Any]:
        async with StreamClient(url) as c:
            return await asyncio.gather(*[c.generate(model, f, timeout_s=120) for f in requests])

    return asyncio.run(go())


@pytest.mark.parametrize("model", sorted(STREAMED))
def test_streamed_parts_join_to_the_reference_tokens(s2s, model):
    """A decoupled model streams each request's tokens in parts of ``stream_interval_tokens`` (the final part may be
    shorter): joined, they are the sequential greedy decode; the first token comes before the end."""
    kind, _, every = STREAMED[model]
    info = s2s.info[kind]
    rng = np.random.default_rng(21)
    requests = [_request(rng, info, k) for k in range(12)]
    requests.append(make_request(rng, info, 3, 1))  # one token: a single, final response
    answers = _stream_all(s2s.grpc, model, requests)
    streamed_parts = 0
    for feeds, a in zip(requests, answers):
        assert a.error is None, a.error
        assert a.tokens == s2s.expected(kind, feeds)
        longest = a.n_tokens
        # parts of `every` new tokens in some row (rows of one request may decode at different steps), not one per
        # token when every > 1
        assert a.parts <= sum(-(-len(t) // every) for t in a.tokens) + 1
        if longest > every:
            assert a.parts >= 2 and a.first_at < a.done_at, (longest, a.parts)
        streamed_parts += a.parts
    assert answers[-1].parts == 1 and answers[-1].n_tokens == 1
    stats = s2s.stats(model)
    assert stats["streamed"] >= streamed_parts - len(requests)  # non-final parts, counted by the backend


def test_a_bad_request_on_a_stream_gets_its_error_while_streams_beside_it_finish(s2s):
    info = s2s.info["gpt2"]
    rng = np.random.default_rng(5)
    goods = [_request(rng, info, k) for k in range(6)]
    bads = [BAD[c][0](info) for c in ("empty source", "output length zero", "token id above the vocabulary")]
    answers = _stream_all(s2s.grpc, "gpt2_stream", goods + bads)
    for feeds, a in zip(goods, answers):
        assert a.error is None and a.tokens == s2s.expected("gpt2", feeds)
    msgs = [a.error or "" for a in answers[len(goods):]]
    assert "prompt length 0" in msgs[0] and "max_output_len" in msgs[1] and "vocabulary" in msgs[2], msgs


def test_load_streams_a_decoupled_model_and_reports_ttft(s2s, tmp_path, capsys):
    """`lazybatch load` sees that the model is decoupled and streams: time to first token and per output token."""
    rc = main(["load", "gpt2_stream", "--url", s2s.grpc, "--rate", "10", "--duration", "2", "--sla-ms", "2000",
               "--seed", "3", "--out", str(tmp_path / "load")])
    assert rc == 0
    assert "TTFT avg" in capsys.readouterr().out
    row = json.loads((tmp_path / "load" / "load.json").read_text())[0]
    assert row["streaming"] and row["errors"] == 0 and row["ok"] == row["sent"] > 5
    assert 0 < row["ttft_avg_ms"] < row["avg_ms"] and 0 < row["tpot_avg_ms"] < row["avg_ms"]
    with Client(s2s.grpc) as c:  # the lengths come from the histogram the model names (chat)
        info = info_from_parameters(c.model_parameters("gpt2_stream"))
    sampler = LengthSampler(info, None, 3)
    assert row["tokens"] == sum(sampler.draw()[1] for _ in range(row["sent"]))


def test_perf_analyzer_streams_from_a_decoupled_model(s2s, tmp_path):
    """`lazybatch perf` on a decoupled model runs perf_analyzer --streaming with valid requests; no errors; the
    time to first token and per output token come from its profile export."""
    out = tmp_path / "perf"
    log, before = _perf(s2s, "gpt2_stream", 8, 2000, out)
    assert "--streaming" in log.splitlines()[0] and "--profile-export-file" in log.splitlines()[0]
    row = json.loads((out / "perf.json").read_text())[0]
    assert row["throughput"] > 1
    # time to first token from perf_analyzer's own timestamps: before the whole stream ends, for every request
    assert row["streamed_requests"] > 5 and 0 < row["ttft_avg_ms"] < row["avg_ms"]
    assert 0 < row["tpot_avg_ms"] < row["avg_ms"]
    after = s2s.stats("gpt2_stream")
    assert after["answered"].get("OK", 0) > before.get("answered", {}).get("OK", 0)
    assert after["streamed"] > before.get("streamed", 0)  # it really streamed
