"""Mixed traffic on one model (docs/results/mixed.md), in-process with real onnxruntime sessions: a late urgent request overtakes a
running bulk batch at a stage boundary, and the bulk batch finishes afterwards with the whole graph's outputs.

tests/batcher/test_urgency.py covers the rule's decisions on a virtual clock; this runs it on the backend's runtime (the
scheduler thread, the stage sessions, tensors split and merged between stages) on a model slow enough that a stage
is several milliseconds, so that the order of the answers is the rule's and not the machine's jitter.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.staging import make_mlp, split_model

URGENT, BULK = 1, 2  # Triton's priority levels: smaller is more urgent


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    root = tmp_path_factory.mktemp("urgency")
    # wide layers: a stage reads 16 MB of weights whatever the batch, so the bulk requests run as one batch (eager
    # splits a batch only where that lowers the mean latency) and each stage lasts milliseconds
    model = make_mlp(root / "wide.onnx", in_dim=256, width=2048, depth=12, out_dim=16, seed=5)
    relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
    return model, split_model(model, root / "stages", cut_after=relus)


def test_a_late_urgent_request_overtakes_the_running_bulk_batch_which_then_finishes_right(heavy):
    model, stages = heavy
    runner = StageRunner(stages, execution_provider="cpu", intra_op_threads=1)
    table = runner.profile([1, 2, 4, 8], reps=3)
    t1 = sum(table.dense[s][1] for s in range(table.graph.n))
    answered: list[tuple[int, float, object, Status]] = []
    done = threading.Condition()

    def respond(handle, outputs, status, error):
        with done:
            answered.append((handle, time.monotonic(), outputs, status))
            done.notify_all()

    rt = BackendRuntime(runner, table, parse_policy("eager:urgency=true").build(max_batch_size=8), respond,
                        is_cancelled=lambda h: False, cancel_poll_s=0.0)
    rt.inline = False  # every request through the scheduler thread, where the rule decides
    rng = np.random.default_rng(0)
    xs: dict[int, np.ndarray] = {}
    bulk = RequestOptions(sla_s=60.0, priority=BULK)
    # 1.5 x t1, not the page's 2 x t1: on this weights-bound model a batch of 4 costs about what one request does,
    # so waiting for the bulk batch answers the urgent request about 2 x t1 after it came, right at a 2 x t1 SLA,
    # where a table a few percent off decides either way (1 CI run in 10 failed so); at 1.5 x t1 waiting misses by
    # half a t1 and preempting (about t1) meets it by as much
    urgent = RequestOptions(sla_s=1.5 * t1, priority=URGENT)

    submitted_at: dict[int, float] = {}

    def submit(h, opts):
        xs[h] = rng.standard_normal((1, 256)).astype(np.float32)
        submitted_at[h] = time.monotonic()
        assert rt.submit(h, {"x": xs[h]}, 1, opts) is None

    def wait(n):
        with done:
            assert done.wait_for(lambda: len(answered) >= n, 30), f"{len(answered)} of {n} answered"

    try:
        # both classes arrive lately (the rule keeps boundaries only while outranking traffic does)
        for h, opts in ((900, urgent), (901, bulk), (902, urgent), (903, bulk)):
            submit(h, opts)
            wait(len(answered) + 1)
        first = len(answered)
        group = []
        for h in range(4):  # the bulk batch: one execute's group, started together on an idle device
            xs[h] = rng.standard_normal((1, 256)).astype(np.float32)
            group.append((h, {"x": xs[h]}, 1, bulk))
        assert rt.submit_group(group) == [None] * 4
        time.sleep(0.5 * table.dense[0][4])  # it is running its first stage
        submit(100, urgent)
        wait(first + 5)
    finally:
        rt.close()
    at = {h: t for h, t, *_ in answered[first:]}
    # it came in at a boundary and ran ahead; the bulk batch resumed where it stopped (without the rule it waits for
    # the whole batch: checked by hand with policy eager, answered 5-6 ms after the last bulk request)
    # on a failure, say why: each answer's time against the urgent one's, and the scheduler's own decisions
    after = {h: round(1e3 * (t - at[100]), 2) for h, t in at.items()}
    why = "\n".join([f"answered, ms after the urgent one: {after}",
                     f"t1 {1e3 * t1:.3f} ms; stage 0 at batch 4 / batch 1: {table.dense[0][4] / table.dense[0][1]:.2f}",
                     "the scheduler's last decisions:", *(d.explain() for d in list(rt.scheduler.log)[-12:])])
    # The rule's promise (batcher/policies/eager/urgency.py): the urgent request runs ahead alone, and merges with the
    # bulk batch it set aside only where the merged pass, with the URGENT_ALONE margin for the table's error, still
    # meets its deadline (keeps_apart). Where the first boundary comes late (a job is cut at 1.5 t1 - 1.25 t1, about
    # 3 of 13 stages) it may catch the bulk batch up with few stages left and merge: all five are then answered from
    # one pass (seen at ccdba33: the bulk rows 0.01-0.06 ms before the urgent one, 14.8 ms after it came against an
    # 18.7 ms SLA). So: either it is answered first, or it merged after running ahead, was answered with that one
    # pass, and within its SLA.
    decisions = list(rt.scheduler.log)
    merged = any(d.kind == "merge" and d.stage > 0 and d.batch_size == 5 for d in decisions)
    urgent_latency = at[100] - submitted_at[100]
    same_pass = max(abs(at[100] - at[h]) for h in range(4)) < 0.25 * t1
    assert at[100] < min(at[h] for h in range(4)) or (merged and same_pass and urgent_latency <= urgent.sla_s), \
        f"{why}\nmerged {merged}, same pass {same_pass}, urgent latency {1e3 * urgent_latency:.2f} ms"
    assert rt.scheduler.log.counts.get("preempt", 0) >= 1, dict(rt.scheduler.log.counts)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for h, _, outputs, status in answered:
        assert status is Status.OK
        np.testing.assert_allclose(outputs["y"], sess.run(None, {"x": xs[h]})[0], rtol=1e-4, atol=1e-5)
