"""The device group's arbiter in-process: two ``BackendRuntime``s on one real arbiter process (backend/arbiter).

The real-server tests (tests/triton/test_arbiter_server.py) load co-located models in one tritonserver; here the
same gate, protocol and arbiter run with the scheduler threads in this process, so the faults can be timed and
counted exactly: a member killed with ``kill -9`` while it holds the device, the arbiter killed under load, a
member leaving and a new one joining under load.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.backend.arbiter import protocol as P
from lazybatch.backend.arbiter.client import attach, query
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.staging import make_mlp, split_model

from test_backend import Collector

GROUP = "g"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import onnx

    root = tmp_path_factory.mktemp("arbiter_models")
    out = {}
    for name, width, depth in (("small", 32, 4), ("large", 512, 6)):
        model = make_mlp(root / f"{name}.onnx", in_dim=16, width=width, depth=depth, out_dim=8, seed=len(name))
        relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
        out[name] = (model, split_model(model, root / f"{name}_stages", cut_after=relus))
    return out


@pytest.fixture
def group(tmp_path, monkeypatch):
    """A fresh arbiter directory per test (its socket and lock); the arbiter it starts is killed at the end."""
    monkeypatch.setenv("LAZYBATCH_ARBITER_DIR", str(tmp_path))
    repo = tmp_path / "repo"
    yield repo
    path, _ = P.group_paths(repo, GROUP)
    try:
        os.kill(query(path)["pid"], signal.SIGKILL)
    except (OSError, ConnectionError):
        pass


def _runtime(stages, repo, name, policy="eager", **kw):
    runner = StageRunner(stages, execution_provider="cpu", intra_op_threads=1)
    table = runner.profile([1, 2, 4, 8], reps=1)
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy(policy).build(max_batch_size=8), c.respond, name=name)
    gate = attach(rt, GROUP, repo, name, **kw)
    return rt, c, gate


def _drive(rt, c, model, n, *, seed=0, gap=0.002, base=0):
    """``n`` requests of batch 1-2 at ``gap`` apart; returns what each must answer."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    want = {}
    for i in range(n):
        x = rng.standard_normal((1 + i % 2, 16)).astype(np.float32)
        want[base + i] = sess.run(None, {"x": x})[0]
        assert rt.submit(base + i, {"x": x}, x.shape[0], RequestOptions(sla_s=1.0)) is None
        time.sleep(gap)
    return want


def _check_once(c, want, *, ok=True):
    for h in want:
        answers = c.answers[h]
        assert len(answers) == 1, f"request {h} answered {len(answers)} times"
        if ok:
            outputs, status, err = answers[0]
            assert status is Status.OK, err
            np.testing.assert_allclose(outputs["y"], want[h], rtol=1e-4, atol=1e-5)


def _load_both(small, large, n=60, base=0):
    """Both models under load at once; returns (want_small, want_large)."""
    (rs, cs, ms), (rl, cl, ml) = small, large
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("l", _drive(rl, cl, ml, n // 2, seed=1, gap=0.004,
                                                                     base=base)))
    t.start()
    out["s"] = _drive(rs, cs, ms, n, seed=2, base=base)
    t.join()
    cs.wait_for(out["s"])
    cl.wait_for(out["l"])
    return out["s"], out["l"]


def test_two_models_share_the_device_through_the_arbiter(models, group):
    rs, cs, gs = _runtime(models["small"][1], group, "small")
    rl, cl, gl = _runtime(models["large"][1], group, "large")
    try:
        ws, wl = _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]))
        # Under this light load a model alone in time mostly holds the solo lease, so that both wait side by side
        # is made sure of: a third member holds the device while both get requests, then lets it go
        path = P.group_paths(group, GROUP)[0]
        holder = _Member(path, "holder")
        holder.acquire()
        holder.granted()
        bl = _drive(rl, cl, models["large"][0], 4, seed=5, gap=0.0, base=500)
        bs = _drive(rs, cs, models["small"][0], 4, seed=6, gap=0.0, base=500)
        time.sleep(0.2)
        assert not any(h >= 500 for h in list(cs.answers) + list(cl.answers)), "ran while another held the device"
        holder.s.sendall(P.FINISHED + P.F64.pack(0.0001) + P.NOTHING)
        cs.wait_for([*ws, *bs])
        cl.wait_for([*wl, *bl])
        _check_once(cs, ws | bs)
        _check_once(cl, wl | bl)
        holder.s.close()
        end = time.monotonic() + 5
        while query(path)["left"] < 1 and time.monotonic() < end:
            time.sleep(0.01)
        stats = query(path)
        by = {m["model"]: m for m in stats["members"]}
        assert set(by) == {"small", "large"} and stats["joined"] == 3
        assert by["small"]["grants"] > 0 and by["large"]["grants"] > 0
        assert gs.grants == by["small"]["grants"] and gl.grants == by["large"]["grants"]
        # contended grants were decided across the models, and logged with both names
        assert by["small"]["decisions"] + by["large"]["decisions"] > 0
        assert any("device to" in r for m in by.values() for r in m["recent"])
        assert 0.99 < by["small"]["share"] + by["large"]["share"] <= 1.0 + 1e-9  # the holder had 0.1 ms of it
        assert not gs.dead and not gl.dead and rs.scheduler.gate is gs
    finally:
        rs.close()
        rl.close()


HOLDER = r"""
import socket, sys, time
from lazybatch.backend.arbiter import protocol as P
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(P.join_message("holder", 1.0, 0) + P.acquire_message(0.0, 1))
assert s.recv(P.REPLY_SIZES[P.WELCOME])[:1] == P.WELCOME
assert s.recv(P.REPLY_SIZES[P.GRANT])[:1] == P.GRANT
print("granted", flush=True)
time.sleep(600)  # holds the device until killed
"""


def test_a_member_killed_while_it_holds_the_device_frees_it(models, group):
    rs, cs, gs = _runtime(models["small"][1], group, "small")
    path = P.group_paths(group, GROUP)[0]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "granted"
        want = _drive(rs, cs, models["small"][0], 10)
        time.sleep(0.3)
        assert not cs.answers, "the small model ran while another member held the only lane"
        t0 = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        cs.wait_for(want, timeout=10)
        released = time.monotonic() - t0
        _check_once(cs, want)
        assert released < 5.0, f"the device came back {released:.2f} s after the holder died"
        stats = query(path)
        assert [m["model"] for m in stats["members"]] == ["small"] and stats["left"] == 1
        assert not gs.dead  # the arbiter lives on
    finally:
        holder.kill()
        holder.wait()
        rs.close()


def _members(path):
    try:
        stats = query(path, timeout=2)
    except (OSError, ConnectionError):
        return None, []
    return stats["pid"], sorted(m["model"] for m in stats["members"])


def test_the_arbiter_killed_under_load_falls_back_then_both_rejoin_a_restarted_one(models, group):
    rs, cs, gs = _runtime(models["small"][1], group, "small")
    rl, cl, gl = _runtime(models["large"][1], group, "large")
    path = P.group_paths(group, GROUP)[0]
    pid = query(path)["pid"]
    try:
        killer = threading.Timer(0.05, os.kill, (pid, signal.SIGKILL))
        killer.start()
        ws, wl = _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]))
        killer.join()
        _check_once(cs, ws)
        _check_once(cl, wl)
        assert gs.fallbacks == 1 and gl.fallbacks == 1  # both saw it die
        # a new arbiter, started by the first stub to retry, with both models as members again
        end = time.monotonic() + 10
        while (_members(path)[1] != ["large", "small"] or not gs.reconnect.rejoins or not gl.reconnect.rejoins) \
                and time.monotonic() < end:
            time.sleep(0.05)
        new_pid, members = _members(path)
        assert members == ["large", "small"] and new_pid != pid
        assert gs.reconnect.rejoins == 1 and gl.reconnect.rejoins == 1
        assert not gs.dead and not gl.dead and rs.scheduler.gate is gs and rl.scheduler.gate is gl
        # and the device is shared again: both are granted by the new arbiter
        grants = gs.grants, gl.grants
        ws2, wl2 = _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]), base=1000)
        cs.wait_for([*ws, *ws2])
        cl.wait_for([*wl, *wl2])
        _check_once(cs, ws2)
        _check_once(cl, wl2)
        by = {m["model"]: m for m in query(path)["members"]}
        assert by["small"]["grants"] > 0 and by["large"]["grants"] > 0
        assert gs.grants > grants[0] and gl.grants > grants[1]  # the metric counters go on growing
    finally:
        rs.close()
        rl.close()


def test_a_model_unloaded_while_its_gate_retries_stops_retrying(models, group, monkeypatch):
    from lazybatch.backend.arbiter import connection

    rs, cs, gs = _runtime(models["small"][1], group, "small")
    path = P.group_paths(group, GROUP)[0]
    # no arbiter can start: every try fails, the gate schedules alone and keeps trying
    monkeypatch.setattr(connection, "_python", lambda: "/nonexistent/python")
    try:
        os.kill(query(path)["pid"], signal.SIGKILL)
        end = time.monotonic() + 10
        while gs.reconnect.tries < 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert gs.dead and gs.reconnect.tries >= 2 and gs.reconnect.rejoins == 0
        want = _drive(rs, cs, models["small"][0], 6)  # served alone meanwhile
        cs.wait_for(want)
        _check_once(cs, want)
    finally:
        rs.close()
    # unloaded: the retry thread ends at once (not at its next try) and tries no more
    end = time.monotonic() + 5
    while gs.reconnect.trying and time.monotonic() < end:
        time.sleep(0.01)
    assert not gs.reconnect.trying
    tries = gs.reconnect.tries
    time.sleep(2.5)  # longer than the longest wait between tries (MAX_DELAY_S)
    assert gs.reconnect.tries == tries


def test_a_member_leaves_and_another_joins_under_load(models, group):
    rs, cs, gs = _runtime(models["small"][1], group, "small")
    rl, cl, gl = _runtime(models["large"][1], group, "large")
    path = P.group_paths(group, GROUP)[0]
    try:
        t = threading.Thread(target=lambda: _drive(rl, cl, models["large"][0], 30, seed=1, gap=0.004))
        t.start()
        want = _drive(rs, cs, models["small"][0], 20)
        rs.close()  # unloaded with requests held: each answered once (OK or UNAVAILABLE)
        for h in want:
            assert len(cs.answers[h]) == 1
            assert cs.answers[h][0][1] in (Status.OK, Status.UNAVAILABLE)
        rs2, cs2, gs2 = _runtime(models["small"][1], group, "small")  # reloaded
        want2 = _drive(rs2, cs2, models["small"][0], 20, seed=3)
        t.join()
        cs2.wait_for(want2)
        cl.wait(30)
        _check_once(cs2, want2)
        assert all(len(a) == 1 and a[0][1] is Status.OK for a in cl.answers.values())
        stats = query(path)
        assert stats["joined"] == 3 and stats["left"] == 1
        assert sorted(m["model"] for m in stats["members"]) == ["large", "small"]
        rs2.close()
    finally:
        rl.close()


# ---------------------------------------------------------------- per-model weight and priority (device_weight,
# device_priority_level in config.pbtxt): raw protocol members, whose job times are what they report with F, so the
# shares are exact whatever the machine's load


class _Member:
    """A member speaking the protocol itself: asks for the device, and reports each granted job as ``ran`` s. Its
    F after a grant also gives back a solo lease (the arbiter's V, which it skips, asks for that)."""

    def __init__(self, path, name, weight=1.0, priority=0):
        import socket

        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(str(path))
        self.s.sendall(P.join_message(name, weight, priority))
        self.leased = self._recv(P.REPLY_SIZES[P.WELCOME])[:2] == P.WELCOME + b"\x01"
        self.revokes = 0

    def _recv(self, n):
        got = b""
        while len(got) < n:
            data = self.s.recv(n - len(got))
            if not data:
                raise ConnectionError("the arbiter closed the connection")
            got += data
        return got

    def acquire(self, latest_start=float("inf"), owed=b""):
        self.s.sendall(owed + P.acquire_message(latest_start, 1))

    def granted(self):
        """Waits for a grant; returns its flags (P.SHARED, P.LEASE; truthy either way)."""
        while (code := self._recv(1)) == P.REVOKE:
            self.revokes += 1
        assert code == P.GRANT
        flags, self.sibling, self.budget = P.GRANT_BODY.unpack(self._recv(P.GRANT_BODY.size))
        return flags | 0x100


def _arbiter_path(group):
    from lazybatch.backend.arbiter.connection import connect

    path, lock = P.group_paths(group, GROUP)
    connect(path, lock).close()  # starts the group's arbiter
    return path


def test_a_weight_3_model_gets_3x_the_device_share_of_a_weight_1_model_under_saturation(group):
    path = _arbiter_path(group)
    heavy, light = _Member(path, "heavy", weight=3.0), _Member(path, "light", weight=1.0)
    ran = P.F64.pack(0.001)
    done = {"heavy": 0, "light": 0}

    def loop(m, name, stop):
        m.acquire()
        try:
            while not stop.is_set():
                m.granted()
                done[name] += 1
                m.acquire(owed=P.FINISHED + ran)  # saturated: always asks again at once
        except OSError:  # closed at the end while waiting for a grant
            pass

    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=a) for a in ((heavy, "heavy", stop), (light, "light", stop))]
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.set()
    for m in (heavy, light):
        m.s.close()  # unblocks the one waiting for a grant
    for t in threads:
        t.join(5)
    by = {d["model"]: d for d in query(path)["departed"]}
    assert by["heavy"]["weight"] == 3.0 and by["light"]["weight"] == 1.0
    assert by["heavy"]["device_s"] + by["light"]["device_s"] > 0.2, "too few jobs ran to judge the shares"
    ratio = by["heavy"]["device_s"] / by["light"]["device_s"]
    assert 2.5 < ratio < 3.5, f"device share heavy/light {ratio:.2f}, weights 3:1 ({by})"


def test_a_more_urgent_device_priority_level_is_granted_first(group):
    path = _arbiter_path(group)
    holder = _Member(path, "holder")
    low = _Member(path, "low", priority=1)
    high = _Member(path, "high", priority=0)
    holder.acquire()
    holder.granted()
    low.acquire(latest_start=0.0)  # its request is already late: least slack by far, but a less urgent level
    high.acquire()  # no deadline at all
    time.sleep(0.3)  # both wait at the arbiter
    holder.s.sendall(P.FINISHED + P.F64.pack(0.0001) + P.NOTHING)
    high.s.settimeout(5)
    assert high.granted()
    low.s.settimeout(0.3)
    import socket

    with pytest.raises(socket.timeout):
        low.s.recv(2)  # the low level waits while the high level holds the device
    high.s.sendall(P.FINISHED + P.F64.pack(0.0001) + P.NOTHING)
    low.s.settimeout(5)
    assert low.granted()
    stats = {m["model"]: m for m in query(path)["members"]}
    assert (stats["high"]["priority"], stats["low"]["priority"]) == (0, 1)
    for m in (holder, low, high):
        m.s.close()


def test_lease_time_counts_in_the_fair_share(group):
    """A lease holder's device time is charged to its virtual time like any job's. Uncharged, the holder stayed
    behind a sibling that had run shared jobs, and the sibling, back from idle, carried that use as a debt: the fair
    share then granted the late holder before the sibling whose deadline could still be met."""
    path = _arbiter_path(group)
    a = _Member(path, "a")
    assert a.leased  # alone at its join
    b = _Member(path, "b")
    b.acquire(latest_start=time.monotonic() + 10)  # revokes a's lease
    a.s.sendall(P.FINISHED + P.F64.pack(0.0) + P.acquire_message(math.inf, 1))  # gives it back, asks again
    assert b.granted() & P.SHARED  # least slack: b's deadline, a has none
    b.s.sendall(P.FINISHED + P.F64.pack(0.05) + P.NOTHING)  # 50 ms shared: b's virtual time 0.05 > the 20 ms lag
    assert a.granted() & P.LEASE  # b idle: a alone, leased
    b.acquire(latest_start=time.monotonic() + 10)  # b back, its deadline can be met; a's lease revoked
    time.sleep(0.1)
    a.s.sendall(P.FINISHED + P.F64.pack(1.0) + P.acquire_message(0.0, 1))  # 1 s under the lease; a is late
    b.s.settimeout(5)
    assert b.granted(), "b waits behind a: a's lease time was not charged to its share"
    for m in (a, b):
        m.s.close()


def test_a_lease_given_back_idle_is_not_activity(group):
    """A lease holder revoked while idle answers at once; the member it hands the device to is leased with the
    holder's last activity (its I), not the instant of that answer: no one-stage window when nobody ran lately."""
    path = _arbiter_path(group)
    a = _Member(path, "a")
    assert a.leased
    b = _Member(path, "b")
    b.acquire()
    time.sleep(0.1)
    a.s.sendall(P.FINISHED + P.F64.pack(0.0) + P.NOTHING)  # the revoke's answer: idle, ran nothing
    b.s.settimeout(5)
    assert b.granted() & P.LEASE
    assert b.sibling == 0.0, "a's answer to the revoke was taken for activity"
    time.sleep(0.3)
    asked = time.monotonic()
    b.s.sendall(P.give_back_message(0.01, 0.2) + P.NOTHING)  # b ran 10 ms under the lease, the last 0.2 s ago
    a.acquire()
    a.s.settimeout(5)
    assert a.granted() & P.LEASE
    # a is leased with b's last job's end (I), not with the instant of b's answer
    assert asked - 0.25 < a.sibling < asked - 0.15
    for m in (a, b):
        m.s.close()


def test_device_weight_and_priority_level_reach_the_arbiter_from_the_gate(models, group):
    rs, cs, gs = _runtime(models["small"][1], group, "small", weight=2.5, priority=3)
    try:
        by = {m["model"]: m for m in query(P.group_paths(group, GROUP)[0])["members"]}
        assert (by["small"]["weight"], by["small"]["priority"]) == (2.5, 3)
    finally:
        rs.close()


def test_device_weight_and_priority_level_parameters(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError

    from test_backend import CONFIG

    def settings(**params):
        extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
        return BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)

    s = settings(device_group="dev0", device_weight="3", device_priority_level="1")
    assert (s.device_group, s.device_weight, s.device_priority_level) == ("dev0", 3.0, 1)
    d = settings(device_group="dev0")
    assert (d.device_weight, d.device_priority_level) == (1.0, 0)
    for params, needle in [({"device_weight": "0"}, "parameters.device_weight.*number > 0"),
                           ({"device_weight": "-1"}, "device_weight must be a number > 0"),
                           ({"device_weight": "x"}, "device_weight must be a number > 0"),
                           ({"device_weight": "inf"}, "device_weight must be a number > 0"),
                           ({"device_priority_level": "-1"}, "parameters.device_priority_level.*integer in 0"),
                           ({"device_priority_level": "1.5"}, "device_priority_level must be an integer"),
                           ({"device_priority_level": "40000"}, "device_priority_level must be an integer")]:
        with pytest.raises(ConfigError, match=needle):
            settings(device_group="dev0", **params)
    # "auto": the device's own group (default_device_group), so the device parameters apply; absent: no group
    assert settings(device_group="auto", device_weight="2").device_weight == 2.0
    with pytest.raises(ConfigError, match="device_weight applies only to a model on a shared device"):
        settings(device_weight="2")
    # "none" is the explicit opt-out, in any case, and then takes no device parameters
    assert settings(device_group="none").device_group == settings(device_group=" None ").device_group == ""
    assert settings(device_group=" None ").device_group_none
    with pytest.raises(ConfigError, match='device_weight applies only to a model on a shared device.*has none'):
        settings(device_group="none", device_weight="2")
    with pytest.raises(ConfigError, match="device_priority_level applies only"):
        settings(device_group="NONE", device_priority_level="1")


# ---------------------------------------------------------------- per-model device metrics (Prometheus port)


def test_device_time_and_wait_metrics_appear_per_model_and_grow(models, group):
    """Each grouped model exports its device time, wait at the device and grants, from its gate's own bookkeeping
    (no query to the arbiter); a model without a group exports none of these families."""
    from lazybatch.backend import metrics as M

    rs, cs, gs = _runtime(models["small"][1], group, "small")
    rl, cl, gl = _runtime(models["large"][1], group, "large")
    ms = M.ModelMetrics("small", ["s"], 8, device=True)
    ml = M.ModelMetrics("large", ["s"], 8, device=True)
    ms.read_device_from(gs)
    ml.read_device_from(gl)

    def values(m):
        return {s.family: s.value for s in m.collect() if s.family in M.DEVICE_FAMILIES}

    try:
        assert set(M.DEVICE_FAMILIES) <= set(ms.family_names())
        assert not set(M.DEVICE_FAMILIES) & set(M.ModelMetrics("alone", ["s"], 8).family_names())
        assert "lazybatch_device_time_seconds_total" not in M.ModelMetrics("alone", ["s"], 8).to_prometheus()
        ws, wl = _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]))
        first = {"small": values(ms), "large": values(ml)}
        for name, v in first.items():
            assert set(v) == set(M.DEVICE_FAMILIES), name
            assert v["lazybatch_device_time_seconds_total"] > 0 and v["lazybatch_device_grants_total"] > 0, name
        # contended: at least one of them waited for the device
        assert sum(v["lazybatch_device_wait_seconds_total"] for v in first.values()) > 0
        text = ms.to_prometheus()
        assert 'lazybatch_device_time_seconds_total{model="small"}' in text
        assert "# TYPE lazybatch_device_wait_seconds_total counter" in text
        # they agree with the arbiter's own figures (the same jobs, timed at either end of the socket)
        by = {m["model"]: m for m in query(P.group_paths(group, GROUP)[0])["members"]}
        assert by["small"]["grants"] == first["small"]["lazybatch_device_grants_total"]
        # (a solo lease's device time reaches the arbiter when the lease goes back: the gate's lease_s until then)
        assert by["large"]["device_s"] == pytest.approx(
            first["large"]["lazybatch_device_time_seconds_total"] - gl.lease_s, rel=0.05, abs=0.005)
        _load_both((rs, cs, models["small"][0]), (rl, cl, models["large"][0]))
        for name, m in (("small", ms), ("large", ml)):
            v = values(m)
            assert v["lazybatch_device_time_seconds_total"] > first[name]["lazybatch_device_time_seconds_total"]
            assert v["lazybatch_device_grants_total"] > first[name]["lazybatch_device_grants_total"]
            assert v["lazybatch_device_wait_seconds_total"] >= first[name]["lazybatch_device_wait_seconds_total"]
    finally:
        rs.close()
        rl.close()


# ---------------------------------------------------------------- the device-wide bound (device_max_queue_size)


def _admit(m, n, held, cap):
    m.s.sendall(P.ADMIT + P.ADMIT_BODY.pack(n, held, cap))
    got = b""
    while len(got) < 1 + P.BOUND_BODY.size:
        got += m.s.recv(1 + P.BOUND_BODY.size - len(got))
    assert got[:1] == P.BOUND
    full, before, members = P.BOUND_BODY.unpack_from(got, 1)
    return bool(full), before, members


def _held(path, n):
    end = time.monotonic() + 5
    while query(path)["held"] != n:
        assert time.monotonic() < end, query(path)
        time.sleep(0.01)


def test_the_arbiter_sums_every_members_held_samples_for_the_device_bound(group):
    path = _arbiter_path(group)
    hog, other = _Member(path, "hog"), _Member(path, "other")
    hog.acquire()  # holds 1 sample
    hog.granted()
    hog.s.sendall(P.FINISHED + P.F64.pack(0.0001) + P.acquire_message(float("inf"), 6))  # now 6
    _held(path, 6)  # the arbiter read it (other's socket is another stream: no order between the two)
    assert _admit(other, 2, 2, 8) == (False, 6, 2)  # 6 + 2 <= 8: admitted
    assert _admit(other, 1, 3, 8) == (True, 8, 2)  # 6 + 3 > 8: refused, and not counted
    assert query(path)["held"] == 8 and query(path)["refused"] == 1
    assert _admit(other, 1, 3, 0) == (False, 8, 2)  # no bound: admitted
    hog.s.sendall(P.NOTHING)  # the hog drained: it holds nothing
    _held(path, 3)  # the other's 3 (its last admission, with no bound, counted)
    assert _admit(other, 1, 4, 8) == (False, 3, 2)
    for m in (hog, other):
        m.s.close()


def test_the_device_wide_queue_bound_refuses_with_the_shared_devices_message(models, group):
    """A model with device_max_queue_size 8 beside a member holding 8 samples: its request is refused with the
    shared device's message (not its own bound's); once the other drains, it is admitted and answered."""
    rs, cs, gs = _runtime(models["small"][1], group, "small", max_queue_size=8)
    path = P.group_paths(group, GROUP)[0]
    hog = _Member(path, "hog")
    try:
        hog.s.sendall(P.acquire_message(float("inf"), 8))
        hog.granted()  # it holds the device and 8 samples
        _held(path, 8)
        x = np.ones((1, 16), np.float32)
        assert rs.submit(1, {"x": x}, 1, RequestOptions(sla_s=10.0)) is None
        cs.wait(1)
        _, status, err = cs.answers[1][0]
        assert status is Status.REJECTED
        assert "shared device's queue is full (8 samples held across 2 models, the device's max_queue_size 8" in err
        assert rs.scheduler.rejected.get("device_queue_full") == 1
        hog.s.sendall(P.FINISHED + P.F64.pack(0.0001) + P.NOTHING)  # drained, and the device is free
        _held(path, 0)
        assert rs.submit(2, {"x": x}, 1, RequestOptions(sla_s=10.0)) is None
        cs.wait(2)
        assert cs.answers[2][0][1] is Status.OK
        assert query(path)["refused"] == 1
    finally:
        hog.s.close()
        rs.close()


def test_device_max_queue_size_parameter(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError

    from test_backend import CONFIG

    def settings(**params):
        extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
        return BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)

    assert settings(device_group="g", device_max_queue_size="64").device_max_queue_size == 64
    assert settings(device_group="g").device_max_queue_size == 0
    for bad, needle in [("-1", "parameters.device_max_queue_size.*integer >= 0"), ("x", "integer >= 0"),
                        ("2", "device_max_queue_size 2 is below max_batch_size 4")]:
        with pytest.raises(ConfigError, match=needle):
            settings(device_group="g", device_max_queue_size=bad)
    assert settings(device_group="auto", device_max_queue_size="64").device_max_queue_size == 64
    with pytest.raises(ConfigError, match="device_max_queue_size applies only to a model on a shared device"):
        settings(device_max_queue_size="64")  # absent: no shared device
    with pytest.raises(ConfigError, match="device_max_queue_size applies only to a model on a shared device"):
        settings(device_group="none", device_max_queue_size="64")


# ---------------------------------------------------------------- device_lanes: jobs the group's device runs at once


def test_device_lanes_parameter(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError

    from test_backend import CONFIG

    def settings(**params):
        extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
        return BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)

    assert settings(device_group="dev0").device_lanes == 2  # the default, from the served figures
    assert settings(device_group="dev0", device_lanes="1").device_lanes == 1
    for bad in ("0", "-1", "1.5", "x", "65"):
        with pytest.raises(ConfigError, match=r"parameters.device_lanes.*device_lanes must be an integer in 1\.\.64"):
            settings(device_group="dev0", device_lanes=bad)
    assert settings(device_group="auto", device_lanes="2").device_lanes == 2
    with pytest.raises(ConfigError, match="device_lanes applies only to a model on a shared device"):
        settings(device_group="none", device_lanes="2")


def test_lane_threads_share_the_cores_among_the_lanes():
    from lazybatch.backend.arbiter.sizing import lane_threads

    assert lane_threads(0, 1, 2) == 0  # one lane: onnxruntime's default, as an ungrouped model
    assert lane_threads(0, 2, 2) == 1 and lane_threads(0, 2, 16) == 8 and lane_threads(0, 3, 16) == 5
    assert lane_threads(0, 4, 2) == 1  # never below one thread
    assert lane_threads(3, 2, 2) == 3  # the model's own intra_op_threads wins


def test_device_lanes_reach_the_arbiter_and_a_different_value_fails_the_load(models, group):
    from lazybatch.batcher.errors import ConfigError

    rs, cs, gs = _runtime(models["small"][1], group, "small", lanes=2)  # the first member starts the arbiter
    try:
        path = P.group_paths(group, GROUP)[0]
        assert query(path)["lanes"] == 2
        with pytest.raises(ConfigError, match=r"device_lanes 1 differs from the 2 lane\(s\) of device group 'g'.*"
                                              r"members: small.*set device_lanes alike"):
            _runtime(models["large"][1], group, "large", lanes=1)
        assert [m["model"] for m in query(path)["members"]] == ["small"]  # the refused model never joined
    finally:
        rs.close()


def _job_intervals(gate):
    """Record each stage job's (start, end) on the host's monotonic clock, from the gate's own calls."""
    spans = []
    started, finished = gate.started, gate.finished

    def on_start(job):
        started(job)
        spans.append([time.monotonic(), None])

    def on_finish(job):
        spans[-1][1] = time.monotonic()
        finished(job)

    gate.started, gate.finished = on_start, on_finish
    return spans


def test_one_lane_never_lets_two_models_jobs_overlap(models, group):
    """Two members under load at once on a one-lane device: no job of one overlaps a job of the other (the
    arbiter's grant comes after the other's F). The two-lane side is the next test: whether two loaded members
    happen to overlap is up to the machine's scheduler, so it is shown with a member that holds a lane."""
    a = _runtime(models["large"][1], group, "a", lanes=1)
    b = _runtime(models["large"][1], group, "b", lanes=1)
    spans = {"a": _job_intervals(a[2]), "b": _job_intervals(b[2])}
    try:
        _load_both((a[0], a[1], models["large"][0]), (b[0], b[1], models["large"][0]), n=120)
        ia, ib = ([s for s in spans[k] if s[1] is not None] for k in ("a", "b"))
        assert len(ia) > 10 and len(ib) > 10
        overlap = sum(1 for s in ia for t in ib if s[0] < t[1] and t[0] < s[1])
        assert overlap == 0, f"{overlap} pairs of jobs ran at once on a one-lane device"
        assert query(P.group_paths(group, GROUP)[0])["lanes"] == 1
    finally:
        a[0].close()
        b[0].close()


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_second_lane_runs_a_models_jobs_while_another_member_holds_the_first(models, group, lanes):
    """A protocol member takes a lane and keeps it. With two lanes the model's requests are all answered while it
    holds it (their jobs ran beside the held one); with one lane none is answered until the holder finishes."""
    rs, cs, _ = _runtime(models["small"][1], group, "a", lanes=lanes)
    path = P.group_paths(group, GROUP)[0]
    hog = _Member(path, "hog")
    try:
        hog.acquire()
        hog.granted()  # it holds a lane from here on, revoke or not, until its F
        want = _drive(rs, cs, models["small"][0], 12, gap=0.0)
        if lanes == 1:
            time.sleep(0.5)
            assert not cs.answers, f"{len(cs.answers)} request(s) ran while the only lane was held"
            hog.s.sendall(P.FINISHED + P.F64.pack(0.0001) + P.NOTHING)  # the lane given back
        cs.wait_for(want)
        _check_once(cs, want)
        states = {m["model"]: m["state"] for m in query(path)["members"]}
        assert states["hog"] == ("granted" if lanes == 2 else "idle"), states
        assert query(path)["lanes"] == lanes
    finally:
        hog.s.close()
        rs.close()
