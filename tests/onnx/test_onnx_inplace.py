"""In-place residual stages (sessions/inplace.py) on a real ort-all split of the small ResNet-50:
which stages qualify, that the chain computes the same bits with and without, and that the backend serves it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lazybatch.onnx_tools.manifest import load_manifest
from lazybatch.sessions import inplace as inplace_mod
from lazybatch.sessions.chain import StageChain, random_feeds
from lazybatch.sessions.inplace import InPlace, inplace_plan, verified
from tests.backend.test_backend import Collector  # Triton's response senders stand-in


@pytest.fixture(scope="module")
def split_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    root = tmp_path_factory.mktemp("inplace")
    export_model("resnet50", root / "m.onnx", small=True, seed=0)
    split_model(root / "m.onnx", root / "s", graph_optimization_level="all")
    return root / "s", load_manifest(root / "s")


def test_plan_picks_identity_blocks_only(split_all):
    d, man = split_all
    plan = inplace_plan(d, man)
    stages = man["stages"]
    assert plan, "an ort-all ResNet-50 has identity blocks whose fused Conv sums onto the stage input"
    # the small ResNet-50: 0 stem (model input), 1, 2 and 4 projection blocks (their Conv sums the shortcut
    # conv's output, made inside the stage), 3 an identity block, 5 and 6 the head
    assert 3 in plan and not plan.keys() & {0, 1, 2, 4, 5, 6}
    for k, step in plan.items():  # the output overwrites the stage's own input, which nothing later reads
        st = stages[k]
        assert [i["name"] for i in st["inputs"]] == [step.input] and st["outputs"][0]["name"] == step.output
        assert all(step.input not in {i["name"] for i in s["inputs"]} for s in stages[k + 1:])
    assert set(StageChain(d, man, whole=False).inplace) == set(plan)  # all pass the bit-for-bit check
    assert StageChain(d, man, whole=False, inplace=False).inplace == {}


def test_plain_split_has_no_inplace_stage(tmp_path):
    """Unoptimised stages end with Relu after the residual Add: nothing to alias."""
    from lazybatch.onnx_tools.split import split_model
    from lazybatch.onnx_tools.zoo import export_model

    export_model("resnet50", tmp_path / "m.onnx", small=True, seed=0)
    split_model(tmp_path / "m.onnx", tmp_path / "s")
    assert inplace_plan(tmp_path / "s", load_manifest(tmp_path / "s")) == {}


@pytest.mark.parametrize("batch", [1, 3])
def test_chain_bit_equal_and_inputs_untouched(split_all, batch):
    d, man = split_all
    on, off = StageChain(d, man, whole=False), StageChain(d, man, whole=False, inplace=False)
    feeds = random_feeds(man["graph_inputs"], batch, np.random.default_rng(batch))
    before = {k: v.copy() for k, v in feeds.items()}
    a, b = on.run_chain(feeds), off.run_chain(feeds)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    for name in feeds:  # the caller's model inputs are never written
        assert np.array_equal(feeds[name], before[name])
    # and the in-place path really ran: the output is the input's own array
    k = min(on.inplace)
    env = off.run_chain(feeds, keep_all=True)
    step = on.inplace[k]
    mine = {n: env[n].copy() for n in (i["name"] for i in man["stages"][k]["inputs"])}
    on.run_stage(k, mine)
    assert mine[step.output] is mine[step.input]
    assert mine[step.output].tobytes() == env[step.output].tobytes()


def test_read_only_or_strided_input_runs_plainly(split_all):
    d, man = split_all
    on = StageChain(d, man, whole=False)
    k = min(on.inplace)
    step = on.inplace[k]
    env = StageChain(d, man, whole=False, inplace=False).run_chain(
        random_feeds(man["graph_inputs"], 2, np.random.default_rng(0)), keep_all=True)
    x = env[step.input].copy()
    x.flags.writeable = False
    ro = {step.input: x}
    on.run_stage(k, ro)
    assert ro[step.output] is not x and ro[step.output].tobytes() == env[step.output].tobytes()
    wide = np.concatenate([env[step.input]] * 2, axis=0)[::2]  # not contiguous
    assert not inplace_mod.usable(wide, step)
    st = {step.input: wide}
    on.run_stage(k, st)
    assert st[step.output] is not wide


def test_verified_refuses_a_step_that_fails(split_all):
    d, man = split_all
    on = StageChain(d, man, whole=False)
    k = min(on.inplace)
    good = on.inplace[k]
    assert verified(on.stages[k], good, man["stages"][k]["inputs"])
    bad = InPlace(good.input, "no_such_output", good.shape, good.dtype)
    assert not verified(on.stages[k], bad, man["stages"][k]["inputs"])


def test_verify_and_profile_cli_run_the_inplace_chain(split_all, cli, tmp_path):
    d, man = split_all
    rc, out, err = cli("profile", d, "--batch-sizes", "1,2", "--repeat", "1", "--warmup", "0", "--no-plot",
                       "--out", tmp_path / "t.json")
    assert rc == 0, err
    import json

    assert json.loads((tmp_path / "t.json").read_text())["meta"]["inplace_stages"] == sorted(inplace_plan(d, man))
    rc, out, err = cli("profile", d, "--batch-sizes", "1", "--repeat", "1", "--warmup", "0", "--no-plot",
                       "--inplace-residuals", "false", "--out", tmp_path / "u.json")
    assert rc == 0, err
    assert json.loads((tmp_path / "u.json").read_text())["meta"]["inplace_stages"] == []
    from lazybatch.onnx_tools.verify import verify_dir

    assert verify_dir(d, load_manifest(d), batch_sizes=(1, 3))["passed"]  # the in-place chain == whole graph


# --- the Triton backend's runtime, without a server ---------------------------------------------------------

def test_backend_stage_runner_switch(split_all):
    from lazybatch.backend.stages import StageRunner

    d, man = split_all
    assert set(StageRunner(d, execution_provider="cpu").inplace) == set(inplace_plan(d, man))
    assert StageRunner(d, execution_provider="cpu", inplace_residuals=False).inplace == {}


def test_backend_lazy_serves_inplace_split_correctly(split_all, monkeypatch):
    from lazybatch.backend import stages as stages_mod
    from lazybatch.backend.request_parsing import RequestOptions
    from lazybatch.backend.runtime import BackendRuntime
    from lazybatch.backend.stages import StageRunner
    from lazybatch.batcher.policies import parse_policy
    from lazybatch.batcher.request import Status

    d, man = split_all
    calls = []
    real = stages_mod.run_inplace
    monkeypatch.setattr(stages_mod, "run_inplace",
                        lambda s, step, f, o=None: calls.append(f[step.input].shape) or real(s, step, f, o))
    runner = StageRunner(d, execution_provider="cpu")
    assert runner.inplace
    table = runner.profile([1, 2, 4, 8], reps=1)
    ref = StageChain(d, man, whole=False, inplace=False)
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy("lazy").build(max_batch_size=8), c.respond,
                        is_cancelled=lambda h: False, cancel_poll_s=0.0)
    name = man["graph_inputs"][0]["name"]
    xs, kept = {}, {}
    rng = np.random.default_rng(7)
    for h in range(12):
        x = rng.standard_normal((1 + (h % 4 == 0), *man["graph_inputs"][0]["dims"])).astype(np.float32)
        xs[h], kept[h] = x, x.copy()
    calls.clear()
    go = threading.Barrier(4)

    def producer(hs):
        go.wait()  # arrive together: sub-batches merge at stage boundaries and split again
        for h in hs:
            assert rt.submit(h, {name: xs[h]}, xs[h].shape[0], RequestOptions(sla_s=1.0)) is None

    threads = [threading.Thread(target=producer, args=(list(range(k, 12, 4)),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.wait(12)
    rt.close()
    assert calls, "no stage ran in place"
    assert any(s[0] > 2 for s in calls), f"no merged sub-batch ran in place: {calls}"  # requests are 1-2 rows
    out_name = man["graph_outputs"][0]["name"]
    for h, ans in c.answers.items():
        assert len(ans) == 1
        outputs, status, error = ans[0]
        assert status is Status.OK, error
        want = ref.run_chain({name: kept[h]})[out_name]
        np.testing.assert_allclose(outputs[out_name], want, rtol=1e-5, atol=1e-6)
        assert np.array_equal(xs[h], kept[h])  # the request's own input array is unchanged


def test_backend_parameter(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError

    cfg = '''name: "m" backend: "python" max_batch_size: 4
input { name: "x" data_type: TYPE_FP32 dims: [ 16 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }
'''
    assert BackendSettings.from_config(parse_config_text(cfg), tmp_path).inplace_residuals
    off = cfg + 'parameters { key: "inplace_residuals" value { string_value: "false" } }'
    assert not BackendSettings.from_config(parse_config_text(off), tmp_path).inplace_residuals
    with pytest.raises(ConfigError, match="inplace_residuals must be true or false"):
        BackendSettings.from_config(parse_config_text(
            cfg + 'parameters { key: "inplace_residuals" value { string_value: "maybe" } }'), tmp_path)


def test_backend_failed_inplace_run_fails_its_batch_without_rerun(split_all, monkeypatch):
    """A run that fails after it may have written over its input cannot be rerun request by request from that input
    (the base runtime's recovery): every request of that batch gets the error, and the server goes on."""
    from lazybatch.backend import stages as stages_mod
    from lazybatch.backend.request_parsing import RequestOptions
    from lazybatch.backend.runtime import BackendRuntime
    from lazybatch.backend.stages import StageRunner
    from lazybatch.batcher.policies import parse_policy
    from lazybatch.batcher.request import Status
    from lazybatch.sessions.inplace import InPlaceRunError

    d, man = split_all
    runner = StageRunner(d, execution_provider="cpu")
    target = min(runner.inplace)
    real = stages_mod.run_inplace
    state = {"armed": True}

    def flaky(session, step, feeds, options=None):
        if state["armed"] and step is runner.inplace[target] and feeds[step.input].shape[0] > 1:
            state["armed"] = False
            feeds[step.input][...] = np.nan  # what a half-finished in-place run leaves behind
            raise InPlaceRunError("RuntimeError: boom (in-place stage: its input buffer was consumed)")
        return real(session, step, feeds, options)

    table = runner.profile([1, 2, 4], reps=1)
    monkeypatch.setattr(stages_mod, "run_inplace", flaky)
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy("graph:50").build(max_batch_size=4), c.respond,
                        is_cancelled=lambda h: False, cancel_poll_s=0.0)
    name = man["graph_inputs"][0]["name"]
    rng = np.random.default_rng(1)
    for h in range(3):
        x = rng.standard_normal((1, *man["graph_inputs"][0]["dims"])).astype(np.float32)
        assert rt.submit(h, {name: x}, 1, RequestOptions(sla_s=5.0)) is None
    c.wait(3)
    for h in range(3, 5):  # the server goes on
        x = rng.standard_normal((1, *man["graph_inputs"][0]["dims"])).astype(np.float32)
        assert rt.submit(h, {name: x}, 1, RequestOptions(sla_s=5.0)) is None
    c.wait(5)
    rt.close()
    failed = [h for h, ans in c.answers.items() if ans[0][1] is not Status.OK]
    assert not state["armed"] and sorted(failed) == [0, 1, 2]
    assert all("its input buffer was consumed" in c.answers[h][0][2] for h in failed)
    assert all(c.answers[h][0][1] is Status.OK and np.isfinite(c.answers[h][0][0][man["graph_outputs"][0]["name"]]).all()
               for h in (3, 4))
