"""fuse_stages: where lazy's batch cap is 1 the backend runs whole passes (backend/fusion.py), with the same results."""

from __future__ import annotations

import pytest

from lazybatch.backend.fusion import fuse_reason
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies import parse_policy
from lazybatch.staging import make_mlp, split_model

SIZES = [1, 2, 4]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuse")
    model = make_mlp(root / "mlp.onnx", in_dim=16, width=32, depth=4, out_dim=8)
    other = make_mlp(root / "other.onnx", in_dim=16, width=32, depth=4, out_dim=8, seed=9)
    stages = split_model(model, root / "stages", max_stages=4)
    return model, other, stages


def _table(runner: StageRunner, per_extra: float) -> LatencyTable:
    """Each stage 1 ms at batch 1 plus ``per_extra`` ms per further sample: 0.95 is a model with no batching gain
    (ResNet-50 on a CPU), 0.1 one where batching pays."""
    rows = [[1e-3 * (1 + per_extra * (b - 1)) for b in SIZES] for _ in range(runner.n_stages)]
    return LatencyTable(runner.manifest.graph(), SIZES, rows)


def built(text: str, **kw):
    """(spec, policy): the registry entry's traits and the built policy, as the backend hands them to fusion."""
    spec = parse_policy(text)
    return spec, spec.build(**kw)


def test_fuse_reason_follows_the_batch_cap_and_the_mode(mlp):
    runner = StageRunner(mlp[2], execution_provider="cpu")
    flat, steep = _table(runner, 0.95), _table(runner, 0.1)
    lazy = built("lazy", max_batch_size=4)
    assert "batch cap is 1" in fuse_reason("auto", *lazy, flat)
    assert fuse_reason("auto", *lazy, steep) is None  # batching pays: the boundaries are where lazy works
    assert fuse_reason("auto", *built("oracle", max_batch_size=4), flat) is not None
    assert fuse_reason("auto", *built("lazy:min_batch_gain=0", max_batch_size=4), flat) is None
    serial = built("serial")
    assert fuse_reason("auto", *serial, flat) is None  # the layer-wise baseline stays layer-wise
    assert fuse_reason("true", *serial, steep) == "fuse_stages: true"
    assert fuse_reason("false", *lazy, flat) is None


def test_eager_keeps_the_stages_and_the_whole_graph_for_spans():
    """fuse_stages auto: eager (spans) wants the whole graph beside its stages, and is never fused outright (its
    boundaries are decided per job); lazy keeps its batch-cap rule; true/false override."""
    from lazybatch.backend.fusion import wants_whole_graph_spans

    eager = built("eager", max_batch_size=8)
    assert wants_whole_graph_spans("auto", *eager)
    assert not wants_whole_graph_spans("false", *eager) and not wants_whole_graph_spans("true", *eager)
    assert not wants_whole_graph_spans("auto", *built("eager:spans=false", max_batch_size=8))
    assert not wants_whole_graph_spans("auto", *built("lazy", max_batch_size=8))
    g = ModelGraph("t", [(f"s{i}", StageType.STATIC) for i in range(3)])
    flat = LatencyTable(g, [1, 2, 4, 8], [[1e-3 * b for b in (1, 2, 4, 8)] for _ in range(3)])  # no batching gain
    assert fuse_reason("auto", *eager, flat) is None
    assert fuse_reason("auto", *built("lazy", max_batch_size=8), flat) is not None
