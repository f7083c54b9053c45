"""The quickstart's co-located pair (benchmarks/pair.py, `bench_triton --pair`) in a short mode on a real
tritonserver: a small MLP beside a larger one, under lazybatch in one device group and under Triton's batcher
at 0 ms, both driven at once, each alone under each for reference. Every request is answered, the two models of a
pair run over the same time, lazybatch's pair went through the arbiter (both members granted the device), and the
printed page has the per-model table and the verdict rows with the one rule's words.

Its own server and repository: the models are named as the quickstart's (<prefix>_eager_grouped in device group
``pair``, <prefix>_triton_0us), only smaller, so the whole module runs in well under a minute."""

from __future__ import annotations

import json
import os
import signal

import onnx
import pytest

from benchmarks.colocation import pair
from benchmarks.harness.verdict import VERDICTS
from lazybatch.backend.arbiter import protocol as P
from lazybatch.backend.arbiter.client import query
from lazybatch.backend.arbiter.sizing import lane_threads, solo_threads, usable_cores
from lazybatch.shipped import PAIR_GROUP, PAIR_OURS, PAIR_POLICIES
from lazybatch.serving import TritonServer, free_port
from lazybatch.staging import make_mlp, split_model

PREFIXES = {"small": "q_small", "large": "q_large"}
SIZES = {"q_small": (32, 4, 1), "q_large": (1024, 8, 2)}  # width, depth, seed
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
        for suffix in CONFIGS:
            add_model(model, repo, name=f"{prefix}_{suffix}", policy=PAIR_POLICIES[suffix], sla_ms=1000,
                      max_batch_size=8, stages=stages, profile_reps=1, execution_provider="cpu",
                      parameters={"device_group": PAIR_GROUP} if suffix == PAIR_OURS else None)
    arbiter_dir = root / "arbiter"
    arbiter_dir.mkdir()
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / "tritonserver.log", env={"LAZYBATCH_ARBITER_DIR": str(arbiter_dir)})
    server.start(timeout=240)
    path = arbiter_dir / P.group_paths(repo, PAIR_GROUP)[0].name
    try:
        yield server, path
    finally:
        server.stop()
        try:
            os.kill(query(path)["pid"], signal.SIGKILL)
        except (OSError, ConnectionError):
            pass


def test_the_pair_runs_both_models_at_once_and_prints_its_table(pair_server, tmp_path, capsys):
    server, arbiter = pair_server
    data = pair.measure(server.endpoints.grpc, PREFIXES, duration_s=1.0, reps=2, configs=CONFIGS,
                        slas={"small": 100.0, "large": 1000.0}, calibration={"small": 20, "large": 10},
                        progress=lambda line: None)
    runs = data["runs"]
    # every repetition: both models together under each configuration, and each alone under each
    assert len(runs) == 2 * (2 * len(CONFIGS) + 2 * len(CONFIGS))
    for r in runs:
        assert r["sent"] > 0 and r["ok"] == r["sent"] and r["errors"] == 0, r
        assert r["model"] == f"{PREFIXES[r['role']]}_{r['config']}"
    for k in range(2):
        for cfg in CONFIGS:
            both = [r for r in runs if (r["rep"], r["mode"], r["config"]) == (k, "together", cfg)]
            assert {r["role"] for r in both} == {"small", "large"}
            assert abs(both[0]["start_unix"] - both[1]["start_unix"]) < 0.5, both  # driven at once, not in turn
    # lazybatch's pair shared the device through the group's arbiter: both members were granted it
    members = {m["model"]: m for m in query(arbiter)["members"]}
    assert {f"{p}_{PAIR_OURS}" for p in PREFIXES.values()} <= set(members)
    assert all(members[f"{p}_{PAIR_OURS}"]["grants"] > 0 for p in PREFIXES.values())
    # the group's defaults: two lanes, and (no intra_op_threads in their configs) each member's pool sized to its
    # share of the cores, said in the server's log
    assert query(arbiter)["lanes"] == 2
    cores = usable_cores()
    log = server.log_file.read_text()
    for prefix in PREFIXES.values():
        assert (f"lazybatch: {prefix}_{PAIR_OURS}: intra_op_threads {lane_threads(0, 2, cores)} (device group "
                f"'{PAIR_GROUP}' runs 2 lanes on {cores} cores") in log, log[-3000:]
        solo = solo_threads(-1, lane_threads(0, 2, cores), cores)  # alone on the device: the whole graph wider
        if solo:
            assert (f"lazybatch: {prefix}_{PAIR_OURS}: whole-graph passes alone on the device run {solo} intra-op "
                    "threads") in log, log[-3000:]

    text = pair.report(data, tmp_path)
    assert capsys.readouterr().out.strip() == text.strip()  # the page is what the quickstart prints
    assert json.loads((tmp_path / "pair.json").read_text())["runs"] == json.loads(json.dumps(runs))
    assert (tmp_path / "pair.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for role, prefix in PREFIXES.items():
        assert sum(1 for line in rows if line.startswith(f"| {role} {prefix}_")) == 2 * len(CONFIGS), text
    verdicts = [[c.strip() for c in line.strip("|").split("|")] for line in rows if ": best Triton / lazybatch" in line
                or "beside the large one / alone" in line]
    assert len(verdicts) == 4, text
    for cells in verdicts:
        assert cells[4] in VERDICTS and cells[1].endswith("]"), cells
