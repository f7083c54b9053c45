"""The prepared GPU check works the first time a device is lent: the carry (parts checked by sha256, resumable,
reassembled and installed) and the measurement call's script, end to end on the CPU provider (its ``--cpu``
rehearsal), with the bundle the device tool can bring back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from benchmarks.harness.meta import ROOT

CARRY = ROOT / "scripts" / "gpu_carry.py"


def _wheel(path: Path, payload: bytes) -> Path:
    """A minimal installable wheel of a package ``carried`` holding ``payload`` (incompressible, so it splits)."""
    dist = "carried-1.0.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("carried/__init__.py", "SIZE = %d\n" % len(payload))
        z.writestr("carried/blob.bin", payload)
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: carried\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def _carry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CARRY), *args], capture_output=True, text=True)


def test_carry_in_checked_parts_resumes_and_installs(tmp_path):
    wheel = _wheel(tmp_path / "carried-1.0-py3-none-any.whl", os.urandom(5 << 19))  # 2.5 MiB
    parts = tmp_path / "parts"
    got = _carry("prepare", "--wheel", str(wheel), "--part-mib", "1", "--dir", str(parts))
    assert got.returncode == 0, got.stderr
    manifest = json.loads((parts / "carry.json").read_text())
    assert [p["name"] for p in manifest["parts"]] == ["part-00", "part-01", "part-02"]
    assert all(p["bytes"] <= 1 << 20 for p in manifest["parts"])
    assert "3 parts" in got.stdout and got.stdout.count("gpu_carry.py have") == 3  # one call per part
    # the machine has the first two parts, the second one cut short: both the cut and the absent part are missing
    there = tmp_path / "there"
    there.mkdir()
    (there / "carry.json").write_bytes((parts / "carry.json").read_bytes())
    (there / "part-00").write_bytes((parts / "part-00").read_bytes())
    (there / "part-01").write_bytes((parts / "part-01").read_bytes()[:1000])
    have = _carry("have", "--dir", str(there))
    assert have.returncode == 0 and "1 of 3 parts here; missing: part-01 part-02" in have.stdout
    refused = _carry("install", "--dir", str(there), "--target", str(tmp_path / "site"))
    assert refused.returncode != 0 and "part-01, part-02" in refused.stderr  # says what to carry again
    for name in ("part-01", "part-02"):
        (there / name).write_bytes((parts / name).read_bytes())
    assert "3 of 3 parts here; complete" in _carry("have", "--dir", str(there)).stdout
    done = _carry("install", "--dir", str(there), "--target", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    size = subprocess.run([sys.executable, "-c", "import carried; print(carried.SIZE)"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert size.stdout.strip() == str(5 << 19)


def test_cpu_rehearsal_runs_every_phase_into_one_bundle(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--cpu"], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHON": sys.executable})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"check.json", "log.txt", "simulate.txt"} <= set(files)  # what the tool brings back
    check = json.loads((out / "check.json").read_text())
    assert check["ok"] is True and check["meta"]["provider"] == "cpu" and check["meta"]["commit"] != "?"
    phases = check["phases"]
    assert list(phases) == ["build", "correct", "timing", "graphs", "streams", "profile", "simulate"]
    assert all(p["status"] == "ok" for p in phases.values())
    for kind in check["meta"]["models"]:
        assert f"table_{kind}.json" in files
        correct = phases["correct"]["result"][kind]
        assert correct["ok"] and correct["device_path_refused"] is None
        assert all(r["device_equals_host"] for r in correct["batches"])
        rows = phases["timing"]["result"][kind]["rows"]
        assert [r["batch"] for r in rows] == [1, 8] and all(r["chain_device_over_whole"] > 0 for r in rows)
        table = json.loads((out / f"table_{kind}.json").read_text())
        assert table["meta"]["device_tensors"] is True
    graphs = phases["graphs"]["result"]
    assert "CUDAExecutionProvider" in graphs["capture"]["skipped"]
    for kind, g in graphs["backend"].items():  # the backend's buckets and padding, rehearsed uncaptured
        assert g["graph_stages"] == g["stages"] and g["refused"] == [], kind
        assert all(r["equal"] for r in g["rows"]), kind
    assert "CUDAExecutionProvider" in phases["streams"]["result"]["skipped"]


def test_a_spent_budget_skips_the_later_phases_and_says_so(tmp_path):
    run = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", str(tmp_path), "--cpu", "--models", "tiny",
                          "--budget-s", "0"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    check = json.loads((tmp_path / "check.json").read_text())
    assert run.returncode == 1 and check["ok"] is False
    assert check["phases"]["build"]["status"].startswith("skipped: the call's time budget")
