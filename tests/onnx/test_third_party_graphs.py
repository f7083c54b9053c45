"""Real pretrained ONNX graphs from PyPI wheels: split --verify, a second size, repo add, and the backend's load.

The graphs are exports lazybatch did not make: Paddle2ONNX (RapidOCR's PP-OCR detector, direction classifier and
recogniser; the classifier writes its batch as -1, all three leave height and width dynamic) and an Ultralytics
YOLOv8n export (NudeNet's 320n.onnx: batch, height and width as dim_params). Silero VAD wraps its network in an
If and is refused with a clear error (docs/onnx.md, "Third-party graphs verified").

The packages are pinned in tests/onnx/third_party_graphs.txt, which scripts/test.sh installs with --no-deps (their
OpenCV/torch dependencies are never imported: the tests only read the .onnx files from the installed package).
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import onnx
import pytest

from lazybatch.backend.config_pbtxt import load_config
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.onnx_tools.verify import verify_dir
from lazybatch.repo import add_model

PINS_FILE = Path(__file__).with_name("third_party_graphs.txt")


def _pins() -> dict[str, str]:
    pins = {}
    for line in PINS_FILE.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    return pins


def graph(dist: str, relpath: str) -> Path:
    """The .onnx file ``relpath`` inside the installed wheel of ``dist`` (found without importing the package)."""
    pin = _pins()[dist]
    try:
        d = distribution(dist)
    except PackageNotFoundError:
        pytest.fail(f"{dist}=={pin} is not installed: run scripts/test.sh, which installs "
                    f"tests/onnx/third_party_graphs.txt (pip install --no-deps -r tests/onnx/third_party_graphs.txt)")
    assert d.version == pin, (f"{dist} {d.version} is installed, the tests and docs/onnx.md are for {pin}: run "
                              "scripts/test.sh (pip install --no-deps -r tests/onnx/third_party_graphs.txt)")
    p = Path(str(d.locate_file(relpath)))
    assert p.is_file(), f"{dist} {pin} should ship {relpath}"
    return p


RAPIDOCR = "rapidocr-onnxruntime"
# (package, file in the wheel, size per sample the package's own pipeline feeds, another size, stage count)
GRAPHS = [
    pytest.param(RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "x=3,48,192",
                 [3, 48, 320], 25, id="rapidocr-cls"),
    pytest.param(RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "x=3,320,320",
                 [3, 256, 384], 11, id="rapidocr-det"),
    pytest.param(RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "x=3,48,320",
                 [3, 48, 640], 35, id="rapidocr-rec"),
    pytest.param("nudenet", "nudenet/320n.onnx", "images=3,320,320", [3, 256, 416], 10, id="nudenet-320n"),
]


@pytest.mark.parametrize("dist, relpath, shape, other, n_stages", GRAPHS)
def test_split_verify_then_repo_add(dist: str, relpath: str, shape: str, other: list[int], n_stages: int,
                                    tmp_path: Path, cli) -> None:
    src = graph(dist, relpath)
    out = tmp_path / "stages"
    rc, stdout, err = cli("split", src, "--out", out, "--verify", "--input-shape", shape)
    assert rc == 0, err
    man = json.loads((out / "manifest.json").read_text())
    v = man["verify"]
    assert v["passed"] and v["batch_sizes"] == [1, 8] and v["boundaries_checked"] >= n_stages - 1, v
    assert any(k.startswith("original:") for k in v["per_batch"]["1"])  # compared with the untouched file too
    assert len(man["stages"]) == n_stages, ("the stage count changed: update the table in docs/onnx.md "
                                            "(Third-party graphs verified) if that is intended")
    name, _, dims = shape.partition("=")
    x = man["graph_inputs"][0]
    assert x["name"] == name and x["dims"] == [3, -1, -1] and x["example_dims"] == [int(d) for d in dims.split(",")]
    # the dynamic height and width stay dynamic in the stage files: the chain also matches at another size
    other_man = json.loads(json.dumps(man))
    other_man["graph_inputs"][0]["example_dims"] = other
    v2 = verify_dir(out, other_man, batch_sizes=(1, 3), original=src)
    assert v2["passed"], {k: v2[k] for k in ("rel_err", "worst_output", "worst_batch")}
    # repo add on those stages: a config Triton and the backend accept, a latency table for every stage
    mdir = add_model(None, tmp_path / "repo", name="m", stages=out, max_batch_size=2, profile_reps=1)
    cfg = load_config(mdir / "config.pbtxt")
    assert cfg.max_batch_size == 2 and cfg.backend == "python"
    assert [(t.name, list(t.dims)) for t in cfg.input] == [(x["name"], [3, -1, -1])]
    assert [(t.name, list(t.dims)) for t in cfg.output] == [(o["name"], o["dims"]) for o in man["graph_outputs"]]
    assert len(LatencyTable.load(mdir / "1" / "latency.json").graph.stages) == n_stages
    _load_in_backend(mdir, cfg)


def _load_in_backend(mdir: Path, cfg) -> None:
    """The backend's initialize: checks config against manifest, loads every stage, warms up at example_dims."""
    from tests.backendhelpers import initialize_model

    initialize_model(mdir, cfg).finalize()


def test_rapidocr_classifier_has_a_minus_one_batch(tmp_path: Path, cli) -> None:
    """The -1 case itself: the file says -1, split records the rewrite, stage files say 'batch'."""
    src = graph(RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    m = onnx.load(str(src), load_external_data=False)
    d0 = m.graph.input[0].type.tensor_type.shape.dim[0]
    assert d0.HasField("dim_value") and d0.dim_value == -1
    rc, _, err = cli("split", src, "--out", tmp_path / "s", "--input-shape", "x=3,48,192")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert "input x: batch dimension -1 -> 'batch'" in man["batch_fixes"]
    assert "output save_infer_model/scale_0.tmp_1: batch dimension -1 -> 'batch'" in man["batch_fixes"]
    for st in man["stages"]:
        sm = onnx.load(str(tmp_path / "s" / st["file"]))
        for vi in list(sm.graph.input) + list(sm.graph.output):
            assert vi.type.tensor_type.shape.dim[0].dim_param == "batch", (st["file"], vi.name)


def test_default_sizes_without_input_shape(tmp_path: Path, cli) -> None:
    """`lazybatch split 320n.onnx --verify` alone: a 1x1 image fails in YOLOv8, so split finds a size that runs."""
    rc, out, err = cli("split", graph("nudenet", "nudenet/320n.onnx"), "--out", tmp_path / "s", "--verify")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert man["verify"]["passed"] and man["graph_inputs"][0]["example_dims"] == [3, 64, 64]
    assert "images=3,64,64" in out


def test_silero_vad_if_is_refused_clearly(tmp_path: Path, cli) -> None:
    """Silero VAD's whole network sits in the branches of an If (16 kHz or 8 kHz): refused, nothing written."""
    src = graph("silero-vad", "silero_vad/data/silero_vad.onnx")
    rc, _, err = cli("split", src, "--out", tmp_path / "s", "--verify")
    assert rc == 2 and "is a If" in err and "control flow" in err and "whole batch" in err, err
    assert not (tmp_path / "s").exists()
    rc, _, err = cli("repo", "add", src, "--repository", tmp_path / "repo", "--name", "vad")
    assert rc == 2 and "control flow" in err, err
    assert not (tmp_path / "repo" / "vad").exists()
