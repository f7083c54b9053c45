"""One intra-op thread pool per process (threads.py): same results as per-session pools, every lazybatch code path
that opens a session works in that mode, and the mode stays a process's own choice.

The global pool is process-wide and cannot be undone, so each check that switches to it runs in a fresh Python
process; the pytest process itself stays on per-session pools (a default-option session would be refused after
the switch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lazybatch.sessions.chain import StageChain, random_feeds
from lazybatch.sessions.threads import global_thread_pool, session_options

from .onnx_helpers import in_fresh_process, small_resnet_split


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_resnet_split(tmp_path_factory.mktemp("threads"))


def test_this_process_stays_on_per_session_pools() -> None:
    """Importing lazybatch and opening sessions through it must not switch a user's process."""
    so = session_options(2)
    assert global_thread_pool() is None
    assert so.use_per_session_threads and so.intra_op_num_threads == 2
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_global_pool_gives_the_same_outputs_and_every_path_works(split_dir: Path) -> None:
    """In a process switched to the global pool: chained stages equal the per-session run here bit for bit, and
    optimise-then-split (a session of its own) and the batchability probe still open their sessions."""
    man = json.loads((split_dir / "s" / "manifest.json").read_text())
    feeds = random_feeds(man["graph_inputs"], 3, np.random.default_rng(7))
    np.savez(split_dir / "feeds.npz", **feeds)
    ref = StageChain(split_dir / "s", man).run_chain(feeds)
    got = in_fresh_process(f"""
        import json, warnings
        import numpy as np
        from lazybatch.sessions.threads import use_global_thread_pool, global_thread_pool, session_options
        from lazybatch.sessions.chain import StageChain
        from lazybatch.onnx_tools.split import split_model
        use_global_thread_pool(1)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            use_global_thread_pool(2)  # cannot resize: keeps the first pool and says so
        man = json.load(open("s/manifest.json"))
        feeds = dict(np.load("feeds.npz"))
        out = StageChain("s", man).run_chain(feeds)
        np.savez("global_out.npz", **out)
        res = split_model("m.onnx", "s_all", graph_optimization_level="all", verify=True)
        print(json.dumps({{"pool": global_thread_pool(), "warned": [str(x.message) for x in w],
                          "per_session": session_options(4).use_per_session_threads,
                          "stages_all": len(res.manifest["stages"])}}))
        """, split_dir)
    assert got["pool"] == 1 and not got["per_session"]
    assert got["warned"] and "cannot be resized" in got["warned"][0]
    assert got["stages_all"] >= 2
    out = dict(np.load(split_dir / "global_out.npz"))
    assert set(out) == set(ref)
    for k in ref:
        np.testing.assert_array_equal(out[k], ref[k])


def test_profile_cli_global_thread_pool_flag(split_dir: Path) -> None:
    """`lazybatch profile --global-thread-pool` profiles on the pool the Triton backend uses, and records it."""
    got = in_fresh_process("""
        import json
        from lazybatch.cli import main
        rc = main(["profile", "s", "--batch-sizes", "1,2", "--repeat", "1", "--warmup", "0", "--no-plot",
                   "--global-thread-pool", "--threads", "1", "--out", "lat.json"])
        print(json.dumps({"rc": rc, "meta": json.load(open("lat.json"))["meta"]}))
        """, split_dir)
    assert got["rc"] == 0
    assert got["meta"]["thread_pool"] == "global"


def test_profile_cli_refuses_spin_with_global_pool(split_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lazybatch.cli import main

    assert main(["profile", str(split_dir / "s"), "--global-thread-pool", "--spin", "--no-plot"]) == 2
    assert "--spin applies to per-session pools" in capsys.readouterr().err
    assert global_thread_pool() is None  # refused before anything switched
