"""The served co-location benchmark's parts that need no server (benchmarks/bench_colocation.py): the configurations
it writes (device_group named explicitly, Triton's rate limiter as a user sets it), the cell summary, the plan, and
the page rendered whole from small synthetic raw data (``--from-results``), with its verdicts by the one rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bench_colocation as B
from benchmarks.colocation import figures as F
from benchmarks.colocation import repo as R
from benchmarks.colocation.drive import summarise
from benchmarks.harness.verdict import MET, MISSED

KINDS = ["mlp", "mobilenet", "bert", "lm"]
T1 = {"mlp": 2.0, "mobilenet": 7.0, "bert": 25.0, "lm": 200.0}
SPEED = {"lazybatch": 0.3, "lazybatch_1lane": 0.5, "lazybatch_nodevice": 0.9, "lazybatch_share": 0.4,
         "triton_0us": 1.0,
         "triton_5000us": 1.2, "triton_20000us": 1.5, "triton_0us_rl": 2.0, "triton_0us_twin": 1.0}


def test_summary_counts_failures_against_every_tightness():
    s = summarise([1.0, 2.0, 30.0], sent=4, sla_ms=10.0, t1_ms=1.0, throughput=3.0, rate=4.0)
    assert (s["ok"], s["failed"]) == (3, 1)
    assert s["violations"] == pytest.approx(2 / 4)  # one late, one failed
    assert s["attain"] == {"2": 0.5, "5": 0.5, "10": 0.5, "20": 0.5}
    pooled = summarise([1.0, 50.0], sent=2, sla_ms=[10.0, 100.0], t1_ms=[1.0, 10.0], throughput=2.0, rate=2.0)
    assert pooled["violations"] == 0.0 and pooled["attain"]["5"] == 1.0 and pooled["attain"]["2"] == 0.5


def test_configurations_name_the_device_group_and_the_rate_limiter_as_a_user_would():
    # every lazybatch configuration names both device_group and cpu_share: a default that changes changes nothing
    assert R.CONFIGS["lazybatch"].params("mlp") == {"device_group": R.GROUP, "cpu_share": "none"}
    assert R.CONFIGS["lazybatch_nodevice"].params("mlp") == {"device_group": "none", "cpu_share": "none"}
    assert R.CONFIGS["lazybatch_share"].params("mlp") == {"device_group": "none", "cpu_share": "auto"}
    assert R.CONFIGS["triton_0us_twin"].policy == R.CONFIGS["triton_0us"].policy == "triton:0"
    assert [c for c, cfg in R.CONFIGS.items() if cfg.rate_limited] == ["triton_0us_rl"]
    prio = R.prio_configs("mobilenet")
    assert prio["lazybatch"].params("mobilenet")["device_priority_level"] == "0"
    assert prio["lazybatch"].params("bert")["device_priority_level"] == "1"
    assert prio["triton_0us_rl"].rl_priority("mobilenet") < prio["triton_0us_rl"].rl_priority("bert")
    assert prio["lazybatch_share"].params("mobilenet")["cpu_share"] == "latency_critical"
    assert prio["lazybatch_share"].params("lm")["cpu_share"] == "best_effort"
    # each lineup judges one of its own configurations and measures Triton's beside it
    for up in R.LINEUPS.values():
        assert up.ours in up.configs and up.ours not in up.beside and R.TWIN in up.beside
        assert set(R.TRITON) <= set(up.configs)
    assert R.LINEUPS["cpu_share"].beside == ["lazybatch_nodevice", R.TWIN]


def test_rates_make_the_asked_share_of_capacity_and_the_plan_takes_turns():
    rates = B.rates_for(0.7, {k: 0.25 for k in KINDS}, T1)
    assert sum(r * T1[k] / 1e3 for k, r in rates.items()) == pytest.approx(0.7)
    args = type("A", (), {"mixes": ["equal", "skewed"], "loads": [0.4, 1.2], "reps": 2, "cnn": "mobilenet",
                          "no_perf": False, "perf_load": 0.7, "duration": 5.0, "lineup": "device"})()
    plan = B.steps(args, KINDS, T1, B.prio_lineup("device", "mobilenet"), "mobilenet")
    sweep = [s for s in plan if s["exp"] == "sweep" and s["driver"] == "load" and not s.get("alone")]
    names = list(R.LINEUPS["device"].configs)
    assert len(sweep) == 2 * 2 * 2 * len(names)
    first = [s["config"] for s in sweep if s["mix"] == "equal" and s["load"] == 0.4]
    assert first[:len(names)] == names and first[len(names):] == names[::-1]
    assert {s["exp"] for s in plan} == {"sweep", "pair", "prio"}
    assert any(s["driver"] == "perf" for s in plan)
    skewed = next(s for s in plan if s["mix"] == "skewed")["rates"]
    assert skewed["mobilenet"] / sum(skewed.values()) == pytest.approx(0.7)
    assert 0 < B.estimate(args) < 3 * 3600
    # the CPU share's lineup: only its configurations, its own model alone in the pair, its priority configuration
    args.lineup = "cpu_share"
    plan = B.steps(args, KINDS, T1, B.prio_lineup("cpu_share", "mobilenet"), "mobilenet")
    assert {s["config"] for s in plan if s["exp"] == "sweep" and not s.get("alone")} == set(
        R.LINEUPS["cpu_share"].configs)
    assert {s["config"] for s in plan if s["exp"] == "pair" and s.get("alone")} == {"lazybatch_share", "triton_0us"}
    assert {s["config"] for s in plan if s["exp"] == "prio"} == {"lazybatch_share", "triton_0us", "triton_0us_rl"}
    assert next(s for s in plan if s["exp"] == "prio" and s["config"] == "lazybatch_share")["cfg"].suffix == \
        "lazybatch_share_prio"


def _cell(rng, exp, cfg, rep, models, *, mix="equal", load=0.7, alone=None, driver="load", speed=None):
    per, raw = {}, {}
    for k in models:
        lat = list(T1[k] * (speed if speed is not None else SPEED[cfg]) * (1 + rng.exponential(1.0, 40)))
        raw[k] = lat
        per[k] = summarise(lat, 40, 10 * T1[k], T1[k], 8.0 / SPEED[cfg], 8.0)
    from benchmarks.colocation.drive import pooled

    c = {"exp": exp, "driver": driver, "mix": mix, "load": load, "rep": rep, "config": cfg, "models": per,
         "all": pooled(per, raw, {k: 10 * T1[k] for k in models}, T1), "seed": rep}
    if alone:
        c["alone"] = alone
    if driver == "load":
        c["sim"] = {"models": per, "all": c["all"]}
    return c


@pytest.fixture
def synthetic(tmp_path):
    rng = np.random.default_rng(0)
    cells = []
    for load in (0.4, 0.7, 1.2):
        for k in KINDS:
            cells.append(_cell(rng, "sweep", "triton_0us", 0, [k], load=load, alone=k))
        for rep in range(3):
            cells += [_cell(rng, "sweep", c, rep, KINDS, load=load) for c in R.CONFIGS]
    cells += [_cell(rng, "sweep", c, rep, KINDS, driver="perf") for rep in range(3) for c in R.CONFIGS]
    for rep in range(3):
        cells += [_cell(rng, "pair", c, rep, ["mlp", "bert"], mix="pair", load=0.0) for c in R.CONFIGS]
        cells += [_cell(rng, "pair", c, rep, [m], mix="pair", load=0.0, alone=m, speed=0.28)
                  for c in ("lazybatch", "triton_0us") for m in ("mlp", "bert")]
        for c in ("lazybatch", "triton_0us", "triton_0us_rl"):
            cells.append(_cell(rng, "prio", c, rep, ["mobilenet"], mix="prio", load=0.0, alone="mobilenet",
                               speed=0.3))
            cells.append(_cell(rng, "prio", c, rep, KINDS, mix="prio", load=0.0))
    res = {"meta": {"command": "python -m benchmarks.bench_colocation", "commit": "abc1234", "started": "now",
                    "cpu": "cpu", "cores": 2, "loadavg_before": "0.1 0.1 0.1", "onnxruntime": "1",
                    "tritonclient": "2"},
           "kinds": KINDS, "t1_ms": T1, "sla_ms": {k: 10 * v for k, v in T1.items()}, "cells": cells,
           "settings": {"loads": [0.4, 0.7, 1.2], "mixes": ["equal"], "reps": 3, "duration_s": 5.0,
                        "sla_multiple": 10.0, "skew_kind": "mobilenet", "rl_priority": 1, "quick": False,
                        "estimate_s": 1800, "wall_s": 1700,
                        "pair": {"small": "mlp", "large": "bert", "small_load": 0.3, "large_load": 1.1},
                        "prio": {"urgent": "mobilenet", "urgent_load": 0.2, "best_effort": ["mlp", "bert", "lm"],
                                 "best_effort_load": 0.8, "rl_urgent": 1, "rl_best_effort": 10}}}
    path = tmp_path / "colocation.json"
    path.write_text(json.dumps(res))
    return res, path


def test_verdicts_follow_the_one_rule_with_the_twin_beside(synthetic):
    res, _ = synthetic
    v = F.sweep_verdicts(res["cells"], KINDS)["equal"]
    # lazybatch is 1/0.3 = 3.3x faster than Triton 0 ms in every cell: the aggregate average goal (2x) is met;
    # the twin is Triton 0 ms itself: it cannot meet it
    assert v["aggregate avg"]["lazybatch_pooled"]["verdict"] == MET
    assert v["aggregate avg"]["triton_0us_twin_pooled"]["verdict"] == MISSED
    # the shipped default (no device scheduler) is judged beside it: 1/0.9 = 1.1x cannot meet 2x
    assert v["aggregate avg"]["lazybatch_nodevice_pooled"]["verdict"] == MISSED
    assert v["aggregate avg"]["counts"]["lazybatch_nodevice"] == {"met": 0, "tie": 0, "missed": 2}
    assert v["aggregate avg"]["lazybatch_1lane_pooled"]["spread"]["n"] == 6  # one lane: judged beside it too
    assert sum(v["aggregate avg"]["counts"]["lazybatch"].values()) == 2  # the 70% and 120% cells
    assert v["peak throughput"]["lazybatch_pooled"]["spread"]["n"] == 3
    pair = F.pair_figures(res["cells"], "mlp", "bert")
    assert pair["lazybatch"]["small avg"]["verdict"] == MET
    assert pair["lazybatch_nodevice"]["small avg"]["verdict"] == MISSED
    assert set(pair["lazybatch"]["best"]) <= set(R.TRITON)
    prio = F.prio_figures(res["cells"], "mobilenet")
    assert set(prio) == {"lazybatch", "triton_0us", "triton_0us_rl"}
    assert prio["lazybatch"]["verdict"] == MET and prio["triton_0us_rl"]["verdict"] == MISSED
    check = F.model_check([c for c in res["cells"] if c["exp"] == "sweep"], "triton_0us", KINDS)
    assert check["all avg"]["geomean"] == pytest.approx(1.0)  # the synthetic sim is the served figure


def test_page_renders_from_results_with_its_plots(synthetic, tmp_path):
    _, path = synthetic
    page = tmp_path / "results" / "colocation.md"
    assert B.main(["--from-results", str(path), "--out", str(tmp_path / "out"), "--page", str(page)]) == 0
    text = page.read_text()
    for part in ("# Many models, one device: served", "commit `abc1234`", "Four models at 70-120% load: goals",
                 "A small model beside a large one", "A high-priority model beside best-effort ones",
                 "SLO attainment", "The simulator's models against served figures", "noise floor",
                 "(perf driver)", "#### equal mix, 120% load (load driver)", "../img/colocation_attainment_vs_load.png"):
        assert part in text, part
    assert "**met**" in text
    assert "per cell lazybatch" in text and "the identical copy" in text
    goals = text.split("goals (load driver)")[1].split("Per load")[0]
    assert "lazybatch_nodevice" in goals and "(missed)" in goals
    assert "| lazybatch_1lane |" in goals
    for img in ("colocation_attainment_vs_load.png", "colocation_attainment_vs_tightness.png"):
        assert (tmp_path / "img" / img).stat().st_size > 1000
    # the raw data's link resolves from the page
    link = text.split("Raw data: [colocation.json](")[1].split(")")[0]
    assert (page.parent / link).resolve() == path.resolve()


def test_a_kept_repository_loses_the_models_no_configuration_names(tmp_path):
    """A configuration renamed since the repository was built (lazybatch_2lanes at 5061e2b) would still be loaded
    by tritonserver, idle, holding memory: the build removes such models and keeps the named ones."""
    from benchmarks.colocation.repo import _prune

    for name in ("mlp_lazybatch", "mlp_lazybatch_2lanes", "mlp_triton_0us"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    (tmp_path / "notes").mkdir()  # not a model: left alone
    said = []
    _prune(tmp_path, {"mlp_lazybatch", "mlp_triton_0us"}, said.append)
    assert sorted(d.name for d in tmp_path.iterdir()) == ["mlp_lazybatch", "mlp_triton_0us", "notes"]
    assert said and "mlp_lazybatch_2lanes" in said[0]


def test_the_cpu_share_lineup_judges_the_share_on_a_page_of_its_own(synthetic, tmp_path):
    """A run of the CPU share's lineup: its page judges lazybatch_share, shows the configuration without either
    beside it, and names its plots after itself (the device scheduler's page keeps its own)."""
    res, _ = synthetic
    keep = set(R.LINEUPS["cpu_share"].configs)
    res = {**res, "cells": [c for c in res["cells"] if c["config"] in keep or c["config"] == "lazybatch"],
           "settings": {**res["settings"], "lineup": "cpu_share"}}
    for c in res["cells"]:  # the pair's alone cells and the priority ones under the share's name
        if c["config"] == "lazybatch":
            c["config"] = "lazybatch_share"
    path = tmp_path / "cpu_share_mix.json"
    path.write_text(json.dumps(res))
    page = tmp_path / "results" / "cpu_share_mix.md"
    assert B.main(["--from-results", str(path), "--out", str(tmp_path / "out"), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Many models, one CPU shared through the kernel: served")
    goals = text.split("goals (load driver)")[1].split("Per load")[0]
    assert "lazybatch_share, pooled over the loads" in goals and "| lazybatch_1lane |" not in goals
    assert "noise floor (the twin)" in goals and "lazybatch_nodevice" in goals
    # 1/0.4 = 2.5x faster than Triton 0 ms in every cell: the aggregate average goal (2x) is met
    v = F.sweep_verdicts(res["cells"], KINDS, ours="lazybatch_share")["equal"]
    assert v["aggregate avg"]["lazybatch_share_pooled"]["verdict"] == MET
    assert "`cpu_share: \"auto\"`" in text and "lazybatch_share = eager, wps" in text
    assert "| lazybatch_share | " in text.split("A high-priority model")[1]
    for img in ("cpu_share_mix_attainment_vs_load.png", "cpu_share_mix_attainment_vs_tightness.png"):
        assert (tmp_path / "img" / img).stat().st_size > 1000
        assert f"../img/{img}" in text
