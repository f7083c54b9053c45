"""The installed distribution (not just the editable checkout) carries every package and data file."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_maps_folders_under_one_namespace(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True)
    wheel = next(tmp_path.glob("lazybatch-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("lazybatch/cli.py", "lazybatch/commands/simulate.py", "lazybatch/batcher/scheduler.py",
                 "lazybatch/batcher/policies/lazy.py", "lazybatch/simulator/engine.py",
                 "lazybatch/simulator/data/resnet50.json", "lazybatch/simulator/data/wmt_en_de_lengths.json",
                 "lazybatch/backend/__init__.py", "lazybatch/client/__init__.py",
                 "lazybatch/npu_model/__init__.py", "lazybatch/npu_model/systolic.py",
                 "lazybatch/npu_model/onnx_front.py", "lazybatch/npu_model/tables.py", "lazybatch/npu_model/vector.py",
                 "lazybatch/npu_model/scalesim_ref.py", "lazybatch/npu_model/validate.py", "lazybatch/commands/npu.py",
                 "lazybatch/npu_model/paper.py", "lazybatch/npu_model/data/npu_resnet50.json",
                 "lazybatch/npu_model/data/npu_gnmt_paperscale.json",
                 "lazybatch/sessions/chain.py", "lazybatch/sessions/threads.py", "lazybatch/formats/dtypes.py",
                 "lazybatch/formats/histograms.py"):
        assert must in names, must
    tops = {n.split("/")[0] for n in names if not n.startswith("lazybatch-")}
    assert tops == {"lazybatch"}, f"generic top-level names would be installed: {tops}"
