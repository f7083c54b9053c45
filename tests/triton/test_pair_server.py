"""The co-located pair (benchmarks/pair.py) in a short mode on a real
tritonserver: a small MLP beside a larger one, under lazybatch's defaults (the CPU share on: no ``cpu_share`` line) and under Triton's
batcher at 0 ms, both driven at once, each alone under each for reference. Every request is answered, the two
models of a pair run over the same time, lazybatch's large model yielded the cores to the small one (its threads
lowered while the small one had requests, read from /proc and from its metrics; the small one's never), Triton's
stubs were left alone, every thread is back at its weight after, and the printed page has the per-model table and
the verdict rows with the one rule's words.

Its own server and repository: the models are named as the pair's (<prefix>_eager_shared, <prefix>_triton_0us), only
smaller, so the whole module runs in well under a minute."""

from __future__ import annotations

import json
import os
import threading
import time

import onnx
import pytest

from benchmarks.colocation import pair
from benchmarks.harness.procs import cores
from benchmarks.harness.verdict import VERDICTS
from lazybatch.backend.cpu_share import ACTIVE_WINDOW_S, POLL_S
from lazybatch.batcher.cpu_rank import NICE_STEPS
from lazybatch.backend.config_pbtxt import config_to_text, load_config
from lazybatch.shipped import PAIR_OURS, PAIR_POLICIES
from lazybatch.serving import TritonServer, free_port
from lazybatch.staging import make_mlp, split_model
from lazybatch.backend.os_weights import thread_nices, threads
from lazybatch.client.soak import scrape
from lazybatch.formats.prometheus import parse_samples
from triton_models import stub_pid

PREFIXES = {"small": "q_small", "large": "q_large"}
SIZES = {"q_small": (32, 4, 1), "q_large": (1024, 8, 2)}  # width, depth, seed
SLAS = {"q_small": 100.0, "q_large": 1000.0}  # the small one's is shorter: the large one yields to it
CONFIGS = (PAIR_OURS, "triton_0us")


@pytest.fixture(scope="module")
def pair_server(tmp_path_factory):
    from lazybatch.repo import add_model

    root = tmp_path_factory.mktemp("pair_server")
    repo = root / "repo"
    for prefix, (width, depth, seed) in SIZES.items():
        model = make_mlp(root / f"{prefix}.onnx", in_dim=64, width=width, depth=depth, out_dim=10, seed=seed)
        relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
        stages = split_model(model, root / f"{prefix}_stages", cut_after=relus)
        # + the noise floor's identical copy of Triton 0 ms, and Triton 0 ms pinned to a core of its own
        for suffix in (*CONFIGS, pair.TWIN, pair.PINNED):
            add_model(model, repo, name=f"{prefix}_{suffix}", policy=PAIR_POLICIES.get(suffix, "triton:0"),
                      sla_ms=SLAS[prefix],
                      max_batch_size=8, stages=stages, profile_reps=1, execution_provider="cpu")
        role = next(r for r, p in PREFIXES.items() if p == prefix)
        path = repo / f"{prefix}_{pair.PINNED}" / "config.pbtxt"
        cfg = load_config(path)
        cfg.instance_group[0].host_policy = pair.PIN_POLICY[role]
        path.write_text(config_to_text(cfg))
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / "tritonserver.log", extra_args=pair.pinning_args(2))
    server.start(timeout=240)
    try:
        yield server, repo
    finally:
        server.stop()


def _cores(tid: int) -> set[int] | None:
    """A thread's cores, or None where it is gone."""
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None


def _share_metric(server, name: str) -> dict[str, float]:
    """model -> the value of one lazybatch_cpu_share_* series on the server's metrics port."""
    return {lab["model"]: v for lab, v in parse_samples(scrape(server.endpoints.metrics), name)}


def test_the_pair_runs_both_models_at_once_and_prints_its_table(pair_server, tmp_path, capsys):
    server, repo = pair_server
    pids = {(role, cfg): stub_pid(repo, f"{PREFIXES[role]}_{cfg}") for role in PREFIXES for cfg in CONFIGS}
    seen: dict[tuple[str, str], set[int]] = {k: set() for k in pids}
    stop = threading.Event()

    def watch() -> None:  # every thread's nice of every stub, read from /proc while the pair runs
        while not stop.wait(0.02):
            for k, pid in pids.items():
                seen[k] |= thread_nices(pid)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        data = pair.measure(server.endpoints.grpc, PREFIXES, duration_s=1.0, reps=2, configs=CONFIGS,
                            slas={"small": 100.0, "large": 1000.0}, calibration={"small": 20, "large": 10},
                            server_pid=server.proc.pid, hand_nice=NICE_STEPS[1], twin=True, pinned=True,
                            progress=lambda line: None)
    finally:
        stop.set()
        watcher.join(5)
    runs = data["runs"]
    # every repetition: both models together under each configuration and the hand-set reference line (Triton's
    # models, the large one's stub lowered from outside), and each model alone under each configuration
    assert data["meta"]["configs"] == [*CONFIGS, pair.PINNED, pair.TWIN, pair.HAND_NICE]
    assert len(runs) == 2 * (2 * (len(CONFIGS) + 3) + 2 * len(CONFIGS))
    # the pinned baseline's stubs run on a core each (host policies, read from /proc); every other one on all
    affinity = data["meta"]["stub_cores"]
    assert affinity[f"small {pair.PINNED}"] == "0" and affinity[f"large {pair.PINNED}"] == "1", affinity
    assert affinity["small triton_0us"] == affinity[f"large {PAIR_OURS}"] == cores(server.proc.pid), affinity
    for r in runs:
        assert r["sent"] > 0 and r["ok"] == r["sent"] and r["errors"] == 0, r
        base = pair.HAND_BASE if r["config"] == pair.HAND_NICE else r["config"]
        assert r["model"] == f"{PREFIXES[r['role']]}_{base}"
    # what each run's stubs ran at, read from /proc while it ran: Triton's unweighted, the reference line's large
    # one at the hand-set nice all along, lazybatch's large one lowered while the small one had requests
    nices = {(r["config"], r["role"]): set(r["stub_nices"]) for r in runs if r["mode"] == "together"}
    assert nices[("triton_0us", "small")] == nices[("triton_0us", "large")] == {0}, nices
    assert nices[(pair.TWIN, "small")] == nices[(pair.TWIN, "large")] == {0}, nices
    assert nices[(pair.PINNED, "small")] == nices[(pair.PINNED, "large")] == {0}, nices
    assert nices[(pair.HAND_NICE, "large")] == {NICE_STEPS[1]} and nices[(pair.HAND_NICE, "small")] == {0}, nices
    assert NICE_STEPS[1] in nices[(PAIR_OURS, "large")] and nices[(PAIR_OURS, "small")] == {0}, nices
    assert thread_nices(pids[("large", "triton_0us")]) == {0}  # the hand-set nice is undone after its turns
    rows = {v["figure"]: v for v in pair.score(data)}
    assert "large avg: hand-set nice (reference) / lazybatch" in rows and "reference: Triton 0 ms, large at nice" \
        in pair.markdown(data)
    # the noise floor: the same ratios with the identical copy in lazybatch's place, never a Triton baseline
    floor = [v for f, v in rows.items() if "its identical copy (noise floor)" in f]
    assert len(floor) == len(pair.GOALS) and all(v["vs_one"] in VERDICTS for v in floor), rows
    assert all(pair.TWIN not in v["picks"] for f, v in rows.items() if f.endswith("best Triton / lazybatch")), rows
    assert "Triton 0 ms, a core each (host policies)" in pair.markdown(data)
    for k in range(2):
        for cfg in CONFIGS:
            both = [r for r in runs if (r["rep"], r["mode"], r["config"]) == (k, "together", cfg)]
            assert {r["role"] for r in both} == {"small", "large"}
            assert abs(both[0]["start_unix"] - both[1]["start_unix"]) < 0.5, both  # driven at once, not in turn
    # lazybatch's large model yielded the cores while the small one had requests; nothing else was ever lowered
    assert NICE_STEPS[1] in seen[("large", PAIR_OURS)], seen
    assert seen[("small", PAIR_OURS)] == {0} and seen[("small", "triton_0us")] == {0}
    lowered = _share_metric(server, "lazybatch_cpu_share_lowered_seconds_total")
    assert lowered[f"{PREFIXES['large']}_{PAIR_OURS}"] > 0 and lowered[f"{PREFIXES['small']}_{PAIR_OURS}"] == 0
    assert not any(m.endswith("triton_0us") for m in lowered)  # Triton's stubs are not in the share
    assert sum(_share_metric(server, "lazybatch_cpu_share_refused_total").values()) == 0
    # each nice change is a WEIGHT decision, counted with the scheduler's decisions, only for the share's models
    weight = {lab["model"]: v for lab, v in parse_samples(scrape(server.endpoints.metrics), "lazybatch_decisions_total")
              if lab.get("kind") == "weight"}
    assert weight[f"{PREFIXES['large']}_{PAIR_OURS}"] >= 1 and weight[f"{PREFIXES['small']}_{PAIR_OURS}"] == 0, weight
    assert not any(m.endswith("triton_0us") for m in weight), weight
    # both were busy at once: each took its part of the cores (a cores decision each), where there are two to split
    split = {lab["model"]: v for lab, v in parse_samples(scrape(server.endpoints.metrics), "lazybatch_decisions_total")
             if lab.get("kind") == "cores"}
    if len(os.sched_getaffinity(0)) >= 2:
        assert split[f"{PREFIXES['large']}_{PAIR_OURS}"] >= 1 and split[f"{PREFIXES['small']}_{PAIR_OURS}"] >= 1, split
    # and once the small model is idle for the share's window, every thread is back, on every core
    end = time.monotonic() + ACTIVE_WINDOW_S + 10 * POLL_S + 5.0
    every = os.sched_getaffinity(0)
    while thread_nices(pids[("large", PAIR_OURS)]) != {0} or any(
            _cores(t) not in (None, every) for t in threads(pids[("large", PAIR_OURS)])):
        assert time.monotonic() < end, "the large model's threads stayed lowered or confined after the small one idled"
        time.sleep(0.05)

    text = pair.report(data, tmp_path)
    assert capsys.readouterr().out.strip() == text.strip()  # the page is what the benchmark prints
    assert json.loads((tmp_path / "pair.json").read_text())["runs"] == json.loads(json.dumps(runs))
    assert (tmp_path / "pair.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for role, prefix in PREFIXES.items():
        # + the pinned baseline, the twin and the reference line
        assert sum(1 for line in rows if line.startswith(f"| {role} {prefix}_")) == 2 * len(CONFIGS) + 3, text
    verdicts = [[c.strip() for c in line.strip("|").split("|")] for line in rows if ": best Triton / lazybatch" in line
                or "beside the large one / alone" in line]
    assert len(verdicts) == 4, text
    for cells in verdicts:
        assert cells[4] in VERDICTS and cells[1].endswith("]"), cells
