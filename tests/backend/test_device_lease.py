"""The device scheduler on by default (docs/colocation.md): the default group, and the solo lease that makes a model
alone in time cost what an ungrouped one costs.

In-process, with a real arbiter process where one runs: a lone member sends nothing per job and keeps its inline
route; a second member's acquire revokes the lease and both then ask per job; alone again, the lease comes back.
The lazy start (backend/arbiter/join.py): one member starts no arbiter, a second one does and both join. And
deterministically, on the simulator's clock: a leased gate schedules request for request as no gate at all.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time

import numpy as np
import pytest

from lazybatch.backend.arbiter import protocol as P
from lazybatch.backend.arbiter.client import ArbiterGate, attach, query
from lazybatch.backend.arbiter.join import SOLO_POLL_S, Membership
from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import parse_config_text
from lazybatch.backend.arbiter.sizing import default_device_group
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies import parse_policy
from lazybatch.simulator import paper_tables, sweep, workload
from lazybatch.simulator.engine import Simulation

from test_arbiter import (GROUP, _arbiter_path, _check_once, _drive, _load_both, _Member, _runtime,  # noqa: F401
                          group, models)
from test_backend import CONFIG, Collector


def _settings(tmp_path, text=CONFIG, **params):
    extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
    return BackendSettings.from_config(parse_config_text(text + extra), tmp_path)


# ---------------------------------------------------------------- configuration


def test_auto_is_the_instances_device_and_absent_or_none_is_no_group(tmp_path):
    cfg = parse_config_text(CONFIG + "instance_group { count: 1 kind: KIND_CPU }")
    assert default_device_group(cfg, "CPU", 0) == ("cpu", "")
    gpu = parse_config_text(CONFIG + "instance_group { count: 1 kind: KIND_GPU gpus: [0, 1] }")
    assert default_device_group(gpu, "GPU", 1) == ("gpu1", "")
    assert default_device_group(cfg, "CPU", 0, "npu") == ("npu", "")  # the modelled NPU, not the CPU
    # several instances on one device were asked to run side by side: not grouped by default
    two = parse_config_text(CONFIG + "instance_group { count: 2 kind: KIND_CPU }")
    group, why = default_device_group(two, "CPU", 0)
    assert group == "" and "2 instances" in why
    s = _settings(tmp_path)
    assert s.device_group == "" and s.device_group_none and not s.device_group_auto  # absent: no shared device
    assert _settings(tmp_path, device_group="none").device_group_none
    a = _settings(tmp_path, device_group="Auto")
    assert a.device_group == "" and a.device_group_auto and not a.device_group_none  # model.py resolves it
    assert _settings(tmp_path, device_group="dev0").device_group == "dev0"


@pytest.mark.parametrize("params", [{"device_group": "dev0"}, {"device_weight": "2"}])
def test_models_under_tritons_batcher_refuse_a_device_group(tmp_path, params):
    """triton:<us> (whole_graph) and batch_per_execute run Triton's batches whole, which no arbiter can gate: they
    join no group by default, and naming one (or a device parameter) fails the load saying why."""
    whole = CONFIG.replace('"graph:5"', '"whole_graph"')
    per_execute = CONFIG.replace('"graph:5"', '"graph:0"') + \
        'parameters { key: "batch_per_execute" value { string_value: "true" } }\n'
    for text, label in ((whole, "whole_graph"), (per_execute, "batch_per_execute")):
        with pytest.raises(ConfigError, match=f"under {label} runs Triton's batches as whole executions"):
            _settings(tmp_path, text, **params)
        s = _settings(tmp_path, text, device_group="none")  # the opt-out is fine
        assert s.device_group == ""


# ---------------------------------------------------------------- one model on the simulator's clock


def _digest(reqs) -> str:
    h = hashlib.sha256()
    for r in reqs:
        h.update(repr((r.id, r.start, r.finish, r.status, r.error)).encode())
    return h.hexdigest()


@pytest.mark.parametrize("policy", ["eager", "graph:5", "lazy"])
def test_a_leased_gate_schedules_request_for_request_as_no_gate(policy):
    """A model alone in its group holds the solo lease from its join: its gate answers every ask locally and sends
    nothing, so every request starts and finishes at the same instant as with no group at all (``device_group:
    none``). Without the lease the gate would ask the arbiter (here silent) and nothing would run."""
    table = paper_tables.shipped_table("resnet50")
    hist = sweep.load_histogram(None)
    arrivals = workload.poisson(0.9 / (sum(table.single) * 8), 400, 3, graph=table.graph, lengths=hist)
    runs = []
    for leased in (None, True):
        reqs = workload.requests(arrivals, 0.05)
        sim = Simulation(table, parse_policy(policy).build(length_histogram=hist))
        if leased:
            stub, arbiter = socket.socketpair()
            arbiter.sendall(P.answer(P.WELCOME, 1))  # the arbiter's answer to the join: alone, leased
            gate = ArbiterGate(stub, sim.scheduler, lambda fn: fn(), "m")
        sim.run(reqs)
        runs.append(_digest(reqs))
        if leased:
            assert gate.leased and gate.sent == 0 and sim.scheduler.gate is gate
            arbiter.settimeout(0.2)
            assert arbiter.recv(4096)[:1] == P.JOIN  # the join, and nothing after it
            with pytest.raises(socket.timeout):
                arbiter.recv(4096)
            gate.leave()
            arbiter.close()
    assert runs[0] == runs[1]


# ---------------------------------------------------------------- the lease on a real arbiter


def test_the_lease_is_revoked_by_a_second_member_and_comes_back_when_alone(models, group):
    path = P.group_paths(group, GROUP)[0]
    rs, cs, gs = _runtime(models["small"][1], group, "small", inline_ok=True)
    try:
        # alone: leased from the join, its inline route on, and not one message per job
        assert gs.leased and rs.route.on
        want = _drive(rs, cs, models["small"][0], 20, base=5000)
        cs.wait_for(want)
        _check_once(cs, want)
        assert gs.sent == 0
        (me,) = query(path)["members"]
        assert me["leased"] and me["messages"] == 0 and me["leases"] == 1
        assert gs.device_s > 0 and gs.lease_s == gs.device_s  # used under the lease, not yet reported

        # a second member joins (no lease: the first holds it) and asks: the lease is revoked, both ask per job
        rl, cl, gl = _runtime(models["large"][1], group, "large", inline_ok=True)
        try:
            assert not gl.leased and not rl.route.on
            ws, wl = _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]))
            _check_once(cs, ws)
            _check_once(cl, wl)
            by = {m["model"]: m for m in query(path)["members"]}
            assert by["small"]["revokes"] >= 1  # the first lease went back when the large model asked
            assert gs.sent > 0 and gl.sent > 0  # and they asked the arbiter for the device
            assert by["small"]["device_s"] > 0
        finally:
            rl.close()  # leaves
        end = time.monotonic() + 5
        while len(query(path)["members"]) != 1 and time.monotonic() < end:
            time.sleep(0.01)

        # alone again: the first job asks once, its grant is a lease, and from then on nothing is sent
        first = _drive(rs, cs, models["small"][0], 1, base=1000)
        cs.wait_for(first)
        assert gs.leased and rs.route.on
        sent = gs.sent
        more = _drive(rs, cs, models["small"][0], 15, seed=4, base=2000)
        cs.wait_for(more)
        _check_once(cs, first | more)
        assert gs.sent == sent, "a member alone again sent messages per job"
    finally:
        rs.close()


def test_a_revoked_holder_answers_within_its_job_in_flight(models, group):
    """The newcomer's wait is bounded by the holder's job in flight: a raw member asks while the leased model is
    idle and is granted at once (the holder gives the lease back on its scheduler thread)."""
    path = P.group_paths(group, GROUP)[0]
    rs, cs, gs = _runtime(models["small"][1], group, "small")
    other = _Member(path, "other")
    try:
        assert gs.leased and not other.leased
        t0 = time.monotonic()
        other.acquire()
        flags = other.granted()
        assert time.monotonic() - t0 < 1.0
        assert flags & P.LEASE  # the small model, idle, went back to asking per job: the newcomer is alone
        end = time.monotonic() + 2
        while gs.leased and time.monotonic() < end:
            time.sleep(0.005)
        assert not gs.leased and gs.sent == 1  # one write: F (the lease's device time) and N
    finally:
        other.s.close()
        rs.close()


def test_a_leased_member_rejoins_a_restarted_arbiter_through_the_join_and_is_leased_again(models, group):
    """The arbiter dies under a lone leased member: the lease goes with the connection (the gate schedules alone,
    inline route on as an ungrouped model), and the rejoin goes through J/W, whose answer leases it again: nothing
    is sent per job afterwards. A revoke or grant of the dead connection (older epoch) changes nothing."""
    path = P.group_paths(group, GROUP)[0]
    rs, cs, gs = _runtime(models["small"][1], group, "small", inline_ok=True)
    try:
        assert gs.leased and gs.leases == 1 and gs.reconnect is not None
        old_epoch = gs.epoch
        os.kill(query(path)["pid"], signal.SIGKILL)
        end = time.monotonic() + 10
        while (not gs.reconnect.rejoins or gs.dead) and time.monotonic() < end:
            time.sleep(0.01)
        assert gs.fallbacks == 1 and gs.reconnect.rejoins == 1 and not gs.dead
        assert gs.epoch == old_epoch + 1 and rs.scheduler.gate is gs
        assert gs.leased and gs.leases == 2 and rs.route.on  # the rejoin's W: leased again
        (me,) = query(path)["members"]
        assert me["leased"] and me["state"] == "granted"
        # a revoke posted by the dead connection's reader is dropped: still leased, inline on
        done = []
        rs.post(lambda: (gs.on_revoke(old_epoch), done.append(1)))
        end = time.monotonic() + 2
        while not done and time.monotonic() < end:
            time.sleep(0.005)
        assert done and gs.leased and not gs.revoked and rs.route.on
        sent = gs.sent
        want = _drive(rs, cs, models["small"][0], 10, base=3000)
        cs.wait_for(want)
        _check_once(cs, want)
        assert gs.sent == sent, "a member leased again after the rejoin sent messages per job"
    finally:
        rs.close()


# ---------------------------------------------------------------- the lazy start (join.py)


def eager_runtime(stages, name):
    """An eager runtime on the stages at one thread, not yet in any group (the caller makes its Membership)."""
    runner = StageRunner(stages, execution_provider="cpu", intra_op_threads=1)
    c = Collector()
    rt = BackendRuntime(runner, runner.profile([1, 2, 4, 8], reps=1),
                        parse_policy("eager").build(max_batch_size=8), c.respond, name=name)
    return rt, c


def close_members(runtimes, members, path):
    """Close the runtimes and their memberships, and kill the arbiter they started, if it runs."""
    for rt in runtimes:
        rt.close()
    for m in members:
        if m is not None:
            m.close()
    try:
        os.kill(query(path)["pid"], signal.SIGKILL)
    except (OSError, ConnectionError):
        pass


def test_one_member_starts_no_arbiter_and_a_second_one_forms_the_group(models, group):
    path, _ = P.group_paths(group, GROUP)
    (rs, cs), (rl, cl) = (eager_runtime(models[k][1], k) for k in ("small", "large"))
    first = second = None
    try:
        first = Membership(rs, GROUP, group, "small")
        time.sleep(5 * SOLO_POLL_S)
        assert first.solo and first.gate is None and rs.scheduler.gate is None and not path.exists()
        want = _drive(rs, cs, models["small"][0], 5, base=5000)  # served ungated
        cs.wait_for(want)
        _check_once(cs, want)
        second = Membership(rl, GROUP, group, "large")  # finds the first solo: starts the arbiter, joins
        assert second.gate is not None and path.exists()
        end = time.monotonic() + 5
        while first.gate is None and time.monotonic() < end:
            time.sleep(0.01)
        assert first.gate is not None and not first.solo and rs.scheduler.gate is first.gate
        assert sorted(m["model"] for m in query(path)["members"]) == ["large", "small"]
        ws, wl = _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]), n=20)
        _check_once(cs, ws)
        _check_once(cl, wl)
    finally:
        close_members((rs, rl), (first, second), path)


def test_a_second_member_with_other_device_lanes_fails_its_load_against_a_solo_one(models, group):
    """The solo member has no arbiter to ask: its device_lanes sit in its lock file, and the member that would start
    the arbiter with another value fails its load instead, naming both values."""
    path, _ = P.group_paths(group, GROUP)
    runner = StageRunner(models["small"][1], execution_provider="cpu", intra_op_threads=1)
    rt = BackendRuntime(runner, runner.profile([1, 2], reps=1), parse_policy("eager").build(max_batch_size=2),
                        Collector().respond, name="small")
    first = None
    try:
        first = Membership(rt, GROUP, group, "small", lanes=2)
        assert first.solo
        with pytest.raises(ConfigError, match=r"device_lanes 1 differs from the 2 lane\(s\) of device group"):
            Membership(rt, GROUP, group, "large", lanes=1)
        assert first.solo and not path.exists()  # the refused member started no arbiter
    finally:
        rt.close()
        if first is not None:
            first.close()


# ---------------------------------------------------------------- seq2seq (decoder) models under a gate


def test_a_seq2seq_model_shares_the_device_per_decoder_step(group, tmp_path):
    """A decoder model joins its device's group by default: beside a neighbour that keeps asking for the device,
    its encoder and decoder-step jobs each wait for a grant, and every sequence still decodes to the reference."""
    import threading

    from lazybatch.backend.request_parsing import RequestOptions
    from lazybatch.backend.seq2seq import Seq2SeqRuntime, Seq2SeqSpec, build_policy
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model
    from lazybatch.repo import profile_seq2seq
    from lazybatch.batcher.request import Status

    from test_seq2seq_runtime import Seq2SeqInfo, make_request

    export_model("gnmt", tmp_path / "m.onnx", small=True, seed=5)
    split_model(tmp_path / "m.onnx", tmp_path / "s")
    table = profile_seq2seq(tmp_path / "s", 8, reps=1, execution_provider="cpu", intra_op_threads=1)
    runner = StageRunner(tmp_path / "s", execution_provider="cpu", intra_op_threads=1)
    spec = Seq2SeqSpec(runner.manifest)
    pol = build_policy(parse_policy("eager"), spec, table, max_batch_size=8, dec_timesteps=None, coverage=0.9)
    answers = {}
    done = threading.Event()
    n = 8

    def respond(handle, outputs, status, error):
        answers[handle] = (outputs, status, error)
        if len(answers) == n:
            done.set()

    def run(gated):
        answers.clear()
        done.clear()
        rt = Seq2SeqRuntime(runner, table, pol if not gated else
                            build_policy(parse_policy("eager"), spec, table, max_batch_size=8, dec_timesteps=None,
                                         coverage=0.9), respond, spec=spec)
        gate = attach(rt, GROUP, group, "s2s") if gated else None
        stop = threading.Event()
        neighbour = None
        if gated:
            neighbour = _Member(P.group_paths(group, GROUP)[0], "neighbour")

            def busy():  # keeps asking: 0.5 ms jobs, back to back
                try:
                    neighbour.acquire()
                    while not stop.is_set():
                        neighbour.granted()
                        time.sleep(0.0005)
                        neighbour.acquire(owed=P.FINISHED + P.F64.pack(0.0005))
                except OSError:
                    pass

            threading.Thread(target=busy, daemon=True).start()
            time.sleep(0.05)
        rng = np.random.default_rng(3)
        info = Seq2SeqInfo(spec.max_source_length, spec.max_length, spec.vocab_size)
        for k in range(n):
            feeds = make_request(rng, info, int(rng.integers(1, info.max_source_length + 1)), 6, batch=1)
            assert rt.submit(k, feeds, 1, RequestOptions()) is None
            time.sleep(0.001)
        assert done.wait(60)
        rt.close()
        stop.set()
        if neighbour is not None:
            neighbour.s.close()
        return {k: (v[0]["output_tokens"].tolist(), v[1]) for k, v in answers.items()}, gate

    alone, _ = run(False)
    shared, gate = run(True)
    assert all(status is Status.OK for _, status in shared.values())
    assert shared == alone  # the same tokens, decoded beside a busy neighbour
    assert gate.sent > 0 and gate.grants > 1  # its jobs were granted one by one, not under a lease


# ---------------------------------------------------------------- a lease beside an active sibling


def _leased_sim(policy, sibling, *, revoke_at=None, load=0.9, n=300):
    """A lone leased gate (a silent arbiter: its W only) on the simulator's clock, told that a sibling was last
    active at ``sibling``; returns (jobs as (start, stages), instant the lease went back, gate)."""
    table = paper_tables.shipped_table("resnet50")
    hist = sweep.load_histogram(None)
    arrivals = workload.poisson(load / (sum(table.single) * 8), n, 5, graph=table.graph, lengths=hist)
    jobs: list[tuple[float, int]] = []
    sim = Simulation(table, parse_policy(policy).build(length_histogram=hist),
                     on_job=lambda t, job: jobs.append((t, job.stop - job.stage)))
    stub, arbiter = socket.socketpair()
    arbiter.sendall(P.answer(P.WELCOME, 1, sibling))
    gate = ArbiterGate(stub, sim.scheduler, lambda fn: fn(), "m")
    back: list[float] = []
    give_back = gate._give_back
    gate._give_back = lambda: (back.append(sim.now()), give_back())  # type: ignore[method-assign]
    if revoke_at is not None:
        sim.call_at(revoke_at, gate.on_revoke)
    sim.run(workload.requests(arrivals, 0.05))
    gate.sent_in_run = gate.sent  # type: ignore[attr-defined]
    gate.leave()  # its reader ends without a fallback
    arbiter.close()
    return jobs, (back[0] if back else None), gate, table


def test_a_leased_holder_keeps_to_one_stage_jobs_while_a_sibling_was_active():
    """Within SIBLING_WINDOW_S of a sibling's last activity the holder's jobs are one stage each, and it still sends
    nothing; past the window its spans are whole again. Without the window, eager runs spans of many stages there."""
    sibling = 0.5
    end = sibling + P.SIBLING_WINDOW_S
    jobs, _, gate, _ = _leased_sim("eager", sibling)
    within = [k for t, k in jobs if t < end]
    after = [k for t, k in jobs if t >= end]
    assert len(within) > 50 and set(within) == {1}, "a job under the lease spanned stages beside an active sibling"
    assert max(after) > 1  # the window passed: spans whole again
    assert gate.leased and gate.sent_in_run == 0  # nothing sent per job under the lease, window or not
    control, _, _, _ = _leased_sim("eager", 0.0)  # no sibling ever active: as ungrouped
    assert max(k for t, k in control if t < end) > 1


def test_a_newcomers_wait_for_a_leased_holder_beside_an_active_sibling_is_one_stage():
    """A revoke (V) just after each of the holder's job starts in the window: it gives the lease back once that job
    ends, at most one stage (the table's longest) after the revoke. Without the window (no sibling ever active),
    a revoke just after a span starts waits for the whole span, longer than any one stage. The runs are the same
    up to the revoke, so its instant is picked from a run without one."""
    table = paper_tables.shipped_table("resnet50")
    longest_stage = max(max(row[1:]) for row in table.dense)
    for sibling in (0.5, 0.0):
        jobs, _, _, _ = _leased_sim("eager", sibling, load=3.0)
        starts = [t for t, k in jobs if 0.5 <= t < 1.4 and (sibling or k > 1)][:8]
        assert len(starts) >= 4
        waits = []
        for t in starts:
            _, back, gate, _ = _leased_sim("eager", sibling, revoke_at=t + 1e-9, load=3.0)
            assert back is not None and not gate.leased
            waits.append(back - t)
        if sibling:
            assert max(waits) <= longest_stage, (max(waits), longest_stage)
        else:
            assert min(waits) > longest_stage  # the whole span in flight


def test_a_real_holder_beside_a_recently_active_sibling_keeps_inline_off_and_stage_jobs_then_not(models, group):
    """On a real arbiter: a sibling that has just given its lease back (F, N) leaves the small model's next grant a
    lease carrying that instant; within the window the holder's inline route refuses and its jobs are one stage
    (eager would run each lone request as one span), still with no message per job; once the window has passed,
    inline passes run again and spans are whole."""
    from lazybatch.backend.fusion import fuse

    path = _arbiter_path(group)
    other = _Member(path, "other")  # alone: leased
    model, stages = models["small"]
    runner = StageRunner(stages, execution_provider="cpu", intra_op_threads=1)
    table = runner.profile([1, 2, 4, 8], reps=1)
    got = fuse(runner, table, model, execution_provider="cpu", intra_op_threads=0, name="t")
    assert got is not None
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8), c.respond, name="small",
                        whole_runner=got[0], inline=True)
    gate = attach(rt, GROUP, group, "small", inline_ok=True)
    jobs: list[tuple[bool, int]] = []
    started = gate.started

    def spy(job):
        started(job)
        jobs.append((time.monotonic() < gate.sibling_until, job.stop - job.stage))

    gate.started = spy  # type: ignore[method-assign]
    x = np.ones((1, 16), np.float32)
    try:
        assert other.leased and not gate.leased and not rt.route.on
        other.s.sendall(P.give_back_message(0.001, 0.0) + P.NOTHING)  # the sibling's lease back: its job just ended
        want = _drive(rt, c, model, 3, gap=0.01)
        c.wait_for(want)
        _check_once(c, want)
        assert gate.leased and gate.near_sibling() and rt.route.on and rt.route.hold_until > time.monotonic()
        sent = gate.sent
        assert rt.route.run([({"x": x}, 1)]) is None  # refused: the sibling may ask any moment
        assert rt.stats.inline_refused.get("a co-located model was active within the window", 0) >= 1
        near = [k for recent, k in jobs if recent]
        assert near and set(near) == {1}, jobs
        assert rt.stats.span_runs == 0
        time.sleep(max(0.0, gate.sibling_until - time.monotonic()) + 0.05)
        assert not gate.near_sibling() and gate.leased
        outs = rt.route.run([({"x": x}, 1)])
        assert outs is not None and outs[0] is not None  # inline again
        more = _drive(rt, c, model, 3, gap=0.01, base=100)
        c.wait_for([*want, *more])
        _check_once(c, more)
        assert max(k for recent, k in jobs if not recent) > 1 and rt.stats.span_runs > 0  # spans whole again
        assert gate.sent == sent  # no message per job under the lease, window or not
    finally:
        other.s.close()
        rt.close()
