"""onnxruntime's two builds stay apart: the plain install names neither, the ``cpu`` and ``gpu`` extras one each,
every install line here picks ``cpu``, and a Python with neither gets an error that names the extras."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib


from benchmarks.harness.meta import ROOT


def test_the_two_builds_are_extras_and_never_both():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("onnxruntime")]
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["cpu"]] == ["onnxruntime"]
    assert [d.split(">")[0] for d in extras["gpu"]] == ["onnxruntime-gpu"]
    assert not any(d.startswith("onnxruntime") for k, v in extras.items() if k not in ("cpu", "gpu") for d in v)


def test_every_install_line_picks_a_build():
    for path in ("scripts/test.sh", "scripts/quickstart.sh"):
        for extras in re.findall(r'-e "\.\[([^\]]*)\]"', (ROOT / path).read_text()):
            assert "cpu" in extras.split(","), f"{path} installs lazybatch without an onnxruntime build"


BLOCKED = "import sys; sys.modules['onnxruntime'] = None; "  # as if neither build were installed


def test_the_cli_names_the_extras_where_onnxruntime_is_missing(tmp_path):
    from lazybatch.staging import make_mlp

    model = make_mlp(tmp_path / "m.onnx")
    run = subprocess.run([sys.executable, "-c", BLOCKED + "from lazybatch.cli import main; "
                          f"sys.exit(main(['split', {str(model)!r}, '--out', {str(tmp_path / 's')!r}]))"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2, run.stderr
    assert "onnxruntime is not installed" in run.stderr and "lazybatch[cpu]" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_backend_refuses_the_load_with_the_same_words():
    run = subprocess.run([sys.executable, "-c", BLOCKED + "from lazybatch.sessions.install import "
                          "require_onnxruntime\ntry:\n    require_onnxruntime()\nexcept Exception as e:\n"
                          "    print(type(e).__name__, e)"], capture_output=True, text=True, cwd=ROOT)
    assert run.stdout.startswith("ConfigError onnxruntime is not installed") and "lazybatch[gpu]" in run.stdout
    from lazybatch.sessions.install import require_onnxruntime

    assert require_onnxruntime().__name__ == "onnxruntime"
