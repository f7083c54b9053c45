"""Bad input: each case exits 2 with what is wrong and what to do, and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from . import onnx_graphs as G
from .onnx_helpers import listing


def _assert_refused(cli, tmp_path: Path, model: Path, extra: tuple = (), *, what: str, remedy: str) -> str:
    before = listing(tmp_path)
    rc, out, err = cli("split", model, "--out", tmp_path / "stages", *extra)
    assert rc == 2
    assert err.strip().splitlines()[-1].startswith("lazybatch split: error: ")
    assert what in err, err
    assert remedy in err, err
    assert listing(tmp_path) == before, "a failed split must leave no output or temporary directory behind"
    return err


def test_not_onnx(tmp_path: Path, cli) -> None:
    p = tmp_path / "notes.onnx"
    p.write_text("this is a text file, not a protobuf\n" * 20)
    _assert_refused(cli, tmp_path, p, what="is not an ONNX model", remedy="onnx.save")


def test_random_bytes_are_not_onnx(tmp_path: Path, cli) -> None:
    p = tmp_path / "noise.onnx"
    p.write_bytes(bytes(range(256)) * 8)
    _assert_refused(cli, tmp_path, p, what="is not an ONNX model", remedy="onnx.save")


def test_missing_file(tmp_path: Path, cli) -> None:
    rc, _, err = cli("split", tmp_path / "nope.onnx", "--out", tmp_path / "s")
    assert rc == 2 and "does not exist" in err and not (tmp_path / "s").exists()


def test_checker_rejects(tmp_path: Path, cli) -> None:
    _assert_refused(cli, tmp_path, G.checker_rejects(tmp_path / "bad.onnx"), what="onnx.checker rejects",
                    remedy="re-export")


@pytest.mark.parametrize("build,op,node", [(G.with_if, "If", "branch"), (G.with_loop, "Loop", "repeat")])
def test_control_flow_refused(tmp_path: Path, cli, build: Callable[[Path], Path], op: str, node: str) -> None:
    err = _assert_refused(cli, tmp_path, build(tmp_path / "cf.onnx"), what=f"'{node}' is a {op}",
                          remedy="unrolled")
    assert "If/Loop/Scan" in err


def test_too_many_stages(tmp_path: Path, cli) -> None:
    assert cli("export", "resnet50", "--small", "--out", tmp_path / "r.onnx")[0] == 0
    err = _assert_refused(cli, tmp_path, tmp_path / "r.onnx", ("--max-stages", "500"), what="more than this graph",
                          remedy="or fewer")
    assert "at most 19 stages" in err


def test_output_dir_exists(tmp_path: Path, cli) -> None:
    assert cli("export", "mobilenet_v1", "--small", "--out", tmp_path / "m.onnx")[0] == 0
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "keep.txt").write_text("mine")
    _assert_refused(cli, tmp_path, tmp_path / "m.onnx", what="already exists", remedy="--force")
    assert (tmp_path / "stages" / "keep.txt").read_text() == "mine"
    rc, _, err = cli("split", tmp_path / "m.onnx", "--out", tmp_path / "stages", "--force")
    assert rc == 0, err
    assert (tmp_path / "stages" / "manifest.json").is_file() and not (tmp_path / "stages" / "keep.txt").exists()


def test_export_target_exists(tmp_path: Path, cli) -> None:
    (tmp_path / "m.onnx").write_text("old")
    rc, _, err = cli("export", "vgg16", "--small", "--out", tmp_path / "m.onnx")
    assert rc == 2 and "already exists" in err and (tmp_path / "m.onnx").read_text() == "old"


def test_reshape_that_folds_the_batch_is_refused(tmp_path: Path, cli) -> None:
    _assert_refused(cli, tmp_path, G.reshape_folds_batch(tmp_path / "r.onnx"), what="Reshape node 'flatten_all'",
                    remedy="start with 0")


def test_hard_coded_batch_fails_verify(tmp_path: Path, cli) -> None:
    err = _assert_refused(cli, tmp_path, G.concat_fixed_batch(tmp_path / "c.onnx"), ("--verify",),
                          what="failed at batch size 8", remedy="dynamic batch")
    assert "append_pad" in err  # onnxruntime's message names the node


def test_hard_coded_batch_refused_even_without_verify(tmp_path: Path, cli) -> None:
    _assert_refused(cli, tmp_path, G.concat_fixed_batch(tmp_path / "c.onnx"), what="failed at batch size 2",
                    remedy="dynamic batch")


def test_old_opset(tmp_path: Path, cli) -> None:
    _assert_refused(cli, tmp_path, G.old_opset(tmp_path / "o.onnx"), what="opset 8", remedy="convert_version")


def test_min_stage_cost_garbage(tmp_path: Path, cli) -> None:
    assert cli("export", "vgg16", "--small", "--out", tmp_path / "v.onnx")[0] == 0
    _assert_refused(cli, tmp_path, tmp_path / "v.onnx", ("--min-stage-cost", "lots"), what="not a number of FLOPs",
                    remedy="500M")


def test_output_not_computed_by_any_stage(tmp_path: Path, cli) -> None:
    _assert_refused(cli, tmp_path, G.passthrough_output(tmp_path / "p.onnx"), what="graph output 'x'",
                    remedy="remove it")
