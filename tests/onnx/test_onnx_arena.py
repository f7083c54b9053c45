"""One CPU arena per process (sessions/arena.py): the same outputs as an arena per session, less memory held after a
large batch through every stage, shrinking still works, and the choice stays the process's own.

The shared arena is registered in onnxruntime's process-wide environment, so each check that turns it on runs in a
fresh Python process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lazybatch.sessions.arena import shared_arena
from lazybatch.sessions.chain import StageChain, random_feeds
from lazybatch.sessions.threads import session_options

from .onnx_helpers import in_fresh_process, small_resnet_split

RUN = """
    import json
    import os
    import numpy as np
    from lazybatch.backend.stages import StageRunner
    from lazybatch.client.soak import process_rss
    from lazybatch.sessions.arena import shared_arena, use_shared_arena
    from lazybatch.sessions.threads import session_options, use_global_thread_pool

    def rss():
        return process_rss(os.getpid()) / 2**20

    use_global_thread_pool(0)  # as in a stub
    if {shared}:
        use_shared_arena()
        use_shared_arena()  # idempotent
    runner = StageRunner("s", execution_provider="cpu")
    feeds = dict(np.load("feeds.npz"))
    out = runner.run_all(feeds)
    np.savez("out_{shared}.npz", **out)
    base = rss()
    big = runner.sample_inputs(256, seed=2)
    runner.run_all(big)
    grown = rss() - base
    runner.release_arenas()
    again = runner.run_all(feeds)  # the shrinking run
    print(json.dumps({{"shared": shared_arena(), "grown_mib": grown,
                      "entry": session_options().get_session_config_entry("session.use_env_allocators")
                      if shared_arena() else None,
                      "same_after_shrink": all(np.array_equal(again[k], out[k]) for k in out)}}))
"""


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_resnet_split(tmp_path_factory.mktemp("arena"))


def test_this_process_keeps_an_arena_per_session() -> None:
    """Importing lazybatch and opening sessions through it registers nothing in a user's process."""
    assert not shared_arena()
    with pytest.raises(Exception, match="does not have configuration"):
        session_options().get_session_config_entry("session.use_env_allocators")


def test_shared_arena_same_outputs_less_memory(split_dir: Path) -> None:
    man = json.loads((split_dir / "s" / "manifest.json").read_text())
    feeds = random_feeds(man["graph_inputs"], 3, np.random.default_rng(7))
    np.savez(split_dir / "feeds.npz", **feeds)
    ref = StageChain(split_dir / "s", man).run_chain(feeds)
    per = in_fresh_process(RUN.format(shared=False), split_dir)
    shared = in_fresh_process(RUN.format(shared=True), split_dir)
    assert not per["shared"] and shared["shared"] and shared["entry"] == "1"
    assert per["same_after_shrink"] and shared["same_after_shrink"]
    for name in ("out_False.npz", "out_True.npz"):
        out = dict(np.load(split_dir / name))
        assert set(out) == set(ref)
        for k in ref:
            np.testing.assert_array_equal(out[k], ref[k])
    # one arena working set at a time instead of one per stage (ad hoc: 10 against 19 MiB here; the rest of the
    # growth, numpy's tensors between stages, is alike in both)
    assert shared["grown_mib"] < 0.75 * per["grown_mib"], (shared, per)
