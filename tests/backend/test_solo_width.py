"""A grouped model alone on the device runs its whole graph on every core (config ``device_solo_intra_op_threads``).

Why: onnxruntime cannot resize a pool, and a member sized for its lane (one thread of two cores) ran on half the
machine the whole time it was alone (docs/colocation.md, "Width alone"). Its whole graph now has a session of its
own at the cores' width, run only while ``alone`` says no other member is active; shared, the same span runs as
the stages at the lane's width, and wide passes leave the latency table (which describes the stages) alone.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from lazybatch.backend.arbiter import protocol as P
from lazybatch.backend.arbiter.join import Membership
from lazybatch.backend.arbiter.sizing import solo_threads
from lazybatch.backend.fusion import fuse
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.errors import ConfigError

from test_arbiter import GROUP, _check_once, _drive, group, models  # noqa: F401
from test_device_lease import _settings, close_members, eager_runtime
from test_backend import Collector


def test_solo_threads_are_the_cores_where_the_lane_has_one_thread():
    assert solo_threads(-1, 1, 2) == 2 and solo_threads(-1, 1, 16) == 16  # the default: every core
    assert solo_threads(-1, 1, 1) == 0  # one core: nothing wider to run on
    assert solo_threads(-1, 0, 2) == 0  # one lane: onnxruntime's default pool has every core already
    assert solo_threads(-1, 8, 16) == 0  # wider lanes: the stages' pools would wake per stage (off unless asked)
    assert solo_threads(16, 8, 16) == 16 and solo_threads(4, 1, 2) == 4  # asked for: given
    assert solo_threads(0, 1, 2) == 0 and solo_threads(1, 1, 2) == 0  # off, or no wider than the lane


def test_the_parameter_is_checked_and_needs_a_group(tmp_path):
    assert _settings(tmp_path, device_group="dev0").device_solo_intra_op_threads == -1
    assert _settings(tmp_path, device_group="dev0", device_solo_intra_op_threads="0").device_solo_intra_op_threads == 0
    with pytest.raises(ConfigError, match="device_solo_intra_op_threads must be an integer >= 0"):
        _settings(tmp_path, device_group="dev0", device_solo_intra_op_threads="-2")
    with pytest.raises(ConfigError, match="apply only|applies only"):
        _settings(tmp_path, device_solo_intra_op_threads="2")


class _Counted:
    """The wide whole-graph runner, counting its runs."""

    def __init__(self, runner):
        self.runner, self.runs = runner, 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def run(self, *a, **kw):  # the inline route
        self.runs += 1
        return self.runner.run(*a, **kw)

    def run_resident(self, *a, **kw):  # a served span
        self.runs += 1
        return self.runner.run_resident(*a, **kw)


def _wide_runtime(stages, model, *, wide: bool, alone):
    """An eager runtime built with a whole graph two threads wide, counted; ``wide``: it is wider than the lane."""
    runner = StageRunner(stages, execution_provider="cpu", intra_op_threads=1)
    table = runner.profile([1, 2, 4, 8], reps=1)
    got = fuse(runner, table, model, execution_provider="cpu", intra_op_threads=2, name="t")
    assert got is not None
    whole = _Counted(got[0])
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8), c.respond, name="small",
                        whole_runner=whole, whole_wide=wide, alone=alone)  # type: ignore[arg-type]
    return rt, c, whole


def test_a_wide_whole_graph_runs_only_alone_and_leaves_the_table_alone(models):
    model, stages = models["small"]
    alone = [False]
    rt, c, whole = _wide_runtime(stages, model, wide=True, alone=lambda: alone[0])
    x = np.ones((1, 16), np.float32)
    try:
        rt.inline = True
        assert rt.route.run([({"x": x}, 1)]) is None  # shared: no inline pass at the wider width
        assert rt.stats.inline_refused.get("the device is shared: the stages run at the lane's width", 0) == 1
        shared = _drive(rt, c, model, 6, gap=0.02)  # lone requests: eager spans them whole
        c.wait_for(shared)
        _check_once(c, shared)
        assert whole.runs == 0 and rt.stats.span_runs > 0  # spans, run as the stages at the lane's width

        alone[0] = True
        outs = rt.route.run([({"x": x}, 1)])
        assert outs is not None and outs[0] is not None and whole.runs == 1  # alone: inline, wide
        rt.inline = False
        seen = rt.calibrator.observations
        runs = rt.settled_stats().stage_runs  # the inline pass's count in it (apply_deferred)
        mine = _drive(rt, c, model, 6, gap=0.02, base=100)
        c.wait_for([*shared, *mine])
        _check_once(c, mine)
        assert whole.runs > 1 and rt.settled_stats().stage_runs - runs == whole.runs - 1  # every one a wide pass
        assert rt.calibrator.observations == seen  # which say nothing of the stages' times
    finally:
        rt.close()
    # the control: a whole graph at the lane's width calibrates the table from its passes
    rt, c, whole = _wide_runtime(stages, model, wide=False, alone=lambda: False)
    try:
        want = _drive(rt, c, model, 6, gap=0.02)
        c.wait_for(want)
        _check_once(c, want)
        assert whole.runs > 0 and rt.calibrator.observations >= whole.runs
    finally:
        rt.close()


def test_membership_says_alone_while_solo_or_leased_and_not_while_a_sibling_runs(models, group):
    path, _ = P.group_paths(group, GROUP)
    (rs, cs), (rl, cl) = (eager_runtime(models[k][1], k) for k in ("small", "large"))
    first = second = None
    try:
        first = Membership(rs, GROUP, group, "small")
        assert first.solo and first.alone()  # no arbiter, no sibling: alone
        second = Membership(rl, GROUP, group, "large")
        end = time.monotonic() + 5
        while first.gate is None and time.monotonic() < end:
            time.sleep(0.01)
        assert first.gate is not None and first.alone() == (first.gate.leased and not first.gate.revoked)
        want = _drive(rs, cs, models["small"][0], 3)  # the small model alone in time: its grant is a lease
        cs.wait_for(want)
        assert first.gate.leased and first.alone()
        other = _drive(rl, cl, models["large"][0], 3)  # the large one asks: the small one's lease is revoked
        cl.wait_for(other)
        _check_once(cl, other)
        end = time.monotonic() + 2
        while first.alone() and time.monotonic() < end:
            time.sleep(0.005)
        assert not first.alone() and not first.gate.leased
        more = _drive(rs, cs, models["small"][0], 3, base=50)  # the sibling idle again: leased at its next ask
        cs.wait_for([*want, *more])
        _check_once(cs, want | more)
        assert first.alone()
    finally:
        close_members((rs, rl), (first, second), path)
