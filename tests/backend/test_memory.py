"""Memory given back after large batches (backend/memory.py): onnxruntime's arenas shrink at the run after a release,
and the runtime releases at an idle moment at most every memory_release_ms."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.memory import arena_shrinkage_option, malloc_trim
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.client.soak import process_rss
from lazybatch.staging import make_heavy, split_model

from test_backend import Collector

MiB = 2**20


@pytest.fixture(scope="module")
def heavy_stages(tmp_path_factory):
    """The burst test's model (2 MiB of activations a sample) in 3 stages: arenas that a batch of 16 grows."""
    import onnx

    root = tmp_path_factory.mktemp("heavy")
    path = make_heavy(root / "heavy.onnx")
    relus = [i for i, n in enumerate(onnx.load(str(path)).graph.node) if n.op_type == "Relu"]
    return split_model(path, root / "stages", cut_after=relus[:2])


def _rss() -> int:
    import os

    return process_rss(os.getpid())


def test_shrinkage_option_names_the_devices():
    assert arena_shrinkage_option(["CPUExecutionProvider"]) == "cpu:0"
    assert arena_shrinkage_option(["CUDAExecutionProvider", "CPUExecutionProvider"]) == "cpu:0;gpu:0"


def test_release_arenas_gives_back_what_a_large_batch_took(heavy_stages):
    runner = StageRunner(heavy_stages, execution_provider="cpu", intra_op_threads=1)
    small = runner.sample_inputs(1)
    for _ in range(3):
        runner.run_all(small)
    malloc_trim()
    base = _rss()
    runner.run_all(runner.sample_inputs(16))
    grown = _rss()
    assert grown - base > 60 * MiB, "a batch of 16 should grow the arenas (2 MiB a sample per tensor)"
    runner.run_all(small)  # the control: an ordinary small run keeps the arenas as large as they grew
    malloc_trim()
    kept = _rss()
    assert kept - base > 0.5 * (grown - base), (base / MiB, grown / MiB, kept / MiB)
    runner.release_arenas()
    out = runner.run_all(small)  # each stage's next run shrinks its arena
    malloc_trim()
    back = _rss()
    assert back - base < 0.2 * (grown - base), (base / MiB, grown / MiB, back / MiB)
    assert not runner._shrink_pending  # one shrinking run per stage, then ordinary runs again
    np.testing.assert_allclose(out["y"], runner.run_all(small)["y"], rtol=1e-6)  # and the results are unchanged


def test_runtime_releases_at_idle_moments_at_most_every_interval(heavy_stages):
    runner = StageRunner(heavy_stages, execution_provider="cpu", intra_op_threads=1)
    table = runner.profile([1, 2, 4, 8], reps=1)
    c = Collector()
    rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8), c.respond,
                        memory_release_s=0.3)
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    try:
        for h in range(4):
            rt.submit(h, {"x": x}, 1, RequestOptions())
        c.wait(4)
        time.sleep(0.6)  # idle past the interval: the next idle moment releases
        rt.submit(4, {"x": x}, 1, RequestOptions())
        c.wait(5)
        end = time.monotonic() + 5
        while rt.stats.memory_releases == 0 and time.monotonic() < end:
            time.sleep(0.05)
        assert rt.stats.memory_releases >= 1
        assert runner._shrink_pending == {0, 1, 2}  # marked: the next run of each stage shrinks its arena
        released = rt.stats.memory_releases
        rt.submit(5, {"x": x}, 1, RequestOptions())  # within the interval of the last release: no new one
        c.wait(6)
        time.sleep(0.15)
        assert rt.stats.memory_releases == released
        assert not runner._shrink_pending  # that run shrank every stage's arena
        assert all(c.answers[h][0][2] is None for h in range(6))
    finally:
        rt.close()
    assert rt.stats.as_dict()["memory_releases"] >= 1


def test_memory_release_ms_parameter(tmp_path):
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.batcher.errors import ConfigError

    from test_backend import CONFIG

    assert BackendSettings.from_config(parse_config_text(CONFIG), tmp_path).memory_release_ms == 5000.0
    off = CONFIG + 'parameters { key: "memory_release_ms" value { string_value: "0" } }'
    assert BackendSettings.from_config(parse_config_text(off), tmp_path).memory_release_ms == 0.0
    bad = CONFIG + 'parameters { key: "memory_release_ms" value { string_value: "-1" } }'
    with pytest.raises(ConfigError, match="memory_release_ms"):
        BackendSettings.from_config(parse_config_text(bad), tmp_path)
