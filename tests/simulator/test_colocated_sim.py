"""The co-located simulator (lazybatch/simulator/colocated.py): processor sharing, the rate-limiter token, the
invariants of every run across models, and the paper's four-model experiment end to end on a few requests."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazybatch.batcher.cpu_rank import ShareMember, cfs_weight
from lazybatch.batcher.device import SharedDevice
from lazybatch.batcher.request import Status
from lazybatch.batcher.interfaces import StageResult
from lazybatch.cli import main
from lazybatch.simulator import colocated_experiment as co
from lazybatch.simulator.colocated import ColocatedSimulation, Tenant

from tests.colocation_helpers import flat, linear_table, periodic, tenant
from tests.batcher.test_properties import scenarios


def test_two_identical_models_under_processor_sharing_take_twice_as_long():
    t = linear_table(4, 1e-3, "m")
    alone = tenant("a", t, periodic(1, 0.0, 1.0), "graph:0")
    ColocatedSimulation([alone], sharing="ps").run()
    a, b = tenant("a", t, periodic(1, 0.0, 1.0), "graph:0"), tenant("b", t, periodic(1, 0.0, 1.0), "graph:0")
    sim = ColocatedSimulation([a, b], sharing="ps")
    sim.run()
    assert abs(alone.requests[0].latency - 4e-3) < 1e-12
    for x in (a, b):
        assert abs(x.requests[0].latency - 8e-3) < 1e-9
    assert sim.ps.peak == 2


def test_processor_sharing_charges_each_job_its_share():
    """A 4 ms job alone for 1 ms, then beside a 1 ms job: that one takes 2 ms, the long one ends at 6 ms."""
    long_, short = linear_table(1, 4e-3, "long"), linear_table(1, 1e-3, "short")
    a = tenant("long", long_, periodic(1, 0.0, 1.0), "graph:0")
    b = tenant("short", short, periodic(1, 1e-3, 1.0, start=1e-3), "graph:0")
    ColocatedSimulation([a, b], sharing="ps").run()
    assert abs(b.requests[0].latency - 2e-3) < 1e-9 and abs(a.requests[0].finish - 5e-3) < 1e-9


def test_the_fair_schedulers_weights():
    assert (cfs_weight(0), cfs_weight(10), cfs_weight(19), cfs_weight(-20)) == (1024, 110, 15, 88761)
    assert cfs_weight(25) == 15 and cfs_weight(-30) == 88761, "clamped as setpriority clamps"


def test_weighted_sharing_gives_the_tighter_sla_its_weight_and_conserves_work():
    """A 1 ms job of the tighter SLA beside a 10 ms one: it runs at 1024 / (1024 + 110) of the device (the other
    at nice 10 while it is in service), ends at 1.107 ms, and the long job still ends at 11 ms (work conserving);
    under plain processor sharing 2 ms and 11 ms; with equal ranks the weighted mode is plain sharing."""
    short, long_ = linear_table(1, 1e-3, "short"), linear_table(1, 10e-3, "long")

    def run(sharing, fast_sla, slow_sla):
        a = tenant("short", short, periodic(1, 0.0, 1.0), "graph:0", share=ShareMember("short", sla_ms=fast_sla))
        b = tenant("long", long_, periodic(1, 0.0, 1.0), "graph:0", share=ShareMember("long", sla_ms=slow_sla))
        ColocatedSimulation([a, b], sharing=sharing).run()
        return a.requests[0].latency, b.requests[0].latency

    s, l = run("wps", 10.0, 100.0)
    assert abs(s - 1e-3 * (1024 + 110) / 1024) < 1e-9 and abs(l - 11e-3) < 1e-9
    s, l = run("ps", 10.0, 100.0)
    assert abs(s - 2e-3) < 1e-9 and abs(l - 11e-3) < 1e-9
    assert run("wps", 50.0, 50.0) == run("ps", 50.0, 50.0)


def test_the_token_serialises_whole_executions():
    """Behind one token a batch runs every stage before another model's batch starts (Triton's rate limiter)."""
    big, small = flat(5, 1e-3, "big"), flat(1, 0.5e-3, "small")
    a = tenant("big", big, periodic(1, 0.0, 1.0), "graph:0")
    b = tenant("small", small, periodic(1, 0.1e-3, 1.0, start=0.1e-3), "graph:0")
    order = []
    ColocatedSimulation([a, b], sharing="token", on_job=lambda now, m, job: order.append((m, job.stage))).run()
    assert order == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0)]
    assert abs(b.requests[0].finish - 5.5e-3) < 1e-9


@st.composite
def colocated(draw):
    k = draw(st.integers(2, 3))
    models = [draw(scenarios()) for _ in range(k)]
    sharing = draw(st.sampled_from(["device", "device2", "ps", "wps", "token"]))
    return models, sharing


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(colocated())
def test_colocated_runs_keep_the_invariants(case):
    """tests/batcher/test_properties.py's invariants across models: every request answered exactly once, each request's
    stages once each and in order, never more jobs on the device than lanes (one per model), a monotone clock."""
    models, sharing = case
    tenants = []
    for i, (table, policy, reqs, fail, cancel) in enumerate(models):
        share = ShareMember(f"m{i}", sla_ms=10.0 * (i + 1)) if sharing == "wps" else None  # unequal weights
        tenants.append(Tenant(f"m{i}", table, policy, reqs, share=share))
    visits = [{r.id: [] for r in t.requests} for t in tenants]
    failed: list[set[int]] = [set() for _ in tenants]
    running = [0] * len(tenants)

    def on_job(now, m, job):
        assert 1 <= len(job.requests) <= job.batch_size <= tenants[m].policy.max_batch_size
        running[m] += 1
        assert running[m] == 1, "a model ran two jobs at once"
        for r in job.requests:
            assert r.arrival <= now
            visits[m][r.id].extend(job.span)
            if r.id in models[m][4] and len(visits[m][r.id]) == 1:
                r.cancelled = True

    def result_for(m, job):
        running[m] -= 1
        fail = models[m][3]
        errs = {r.id: "injected" for r in job.requests if (r.id, job.stage) in fail and r.id not in failed[m]}
        failed[m].update(errs)
        return StageResult(errors=errs) if errs else None

    lanes = 2 if sharing == "device2" else 1
    device = SharedDevice(lanes=lanes) if sharing.startswith("device") else None
    sim = ColocatedSimulation(tenants, sharing="device" if device else sharing, device=device, on_job=on_job,
                              result_for=result_for)
    budget = sum(len(t.table.graph.stage_visits(r.enc_steps, r.dec_steps)) for t in tenants for r in t.requests)
    sim.run(max_stage_execs=budget)
    answered = [[r.id for r in a] for a in sim.answers]
    if device is not None:
        assert sim.ps.peak <= lanes
    elif sharing == "token":
        assert sim.ps.peak == 1
    for m, t in enumerate(tenants):
        g = t.table.graph
        assert sorted(answered[m]) == [r.id for r in t.requests], "every request answered exactly once"
        for r in t.requests:
            program = g.stage_visits(r.enc_steps, r.dec_steps)
            seen = visits[m][r.id]
            assert r.finish is not None and r.finish >= r.arrival
            if r.id in failed[m] or r.id in models[m][4]:
                assert r.status in (Status.ERROR, Status.CANCELLED) and seen == program[:len(seen)]
            else:
                assert r.status is Status.OK, r.error
                assert seen == program


def test_the_four_model_experiment_runs_end_to_end():
    exp = co.Experiment(requests=120)
    result = exp.sweep([0.7, 1.2], ["equal", "skewed"], 1)
    assert {c["config"] for c in result["cells"]} == set(co.CONFIGS)
    for c in result["cells"]:
        run = c["runs"][0]
        for name in exp.names:
            assert run[name]["p99_alone_ms"] > 0 and run[name]["p99_norm"] > 0
        if c["config"] == co.OURS:
            assert abs(sum(v["share"] for v in run["device"].values()) - 1.0) < 1e-9
    head = co.headline(result)
    assert set(head) == {"equal", "skewed"} and set(head["equal"]) == set(co.METRICS)
    text = co.format_tables(result)
    assert "| colocated |" in text and "graph_0ms_token" in text


def test_simulate_colocate_cli(tmp_path, capsys):
    rc = main(["simulate", "--colocate", "--requests", "80", "--seeds", "1", "--load", "0.7", "--mix", "equal",
               "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| colocated |" in out and "best graph baseline" in out
    data = json.loads((tmp_path / "colocation.json").read_text())
    assert data["models"] == list(co.PAPER_FOUR) and data["seeds"] == 1
