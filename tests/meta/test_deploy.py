"""docker-compose.yml and deploy/Dockerfile: validated by Debian's docker-compose (no engine needed) and checked for
what docs/deploy.md promises: per profile a server on 8000-8002 with the repository mounted, the GPU reserved in
the gpu profile only, the pinned NGC tag in both images, and perf_analyzer from the matching -py3-sdk image.

scripts/test.sh installs docker-compose when it is missing (apt-get, as root), so these run in CI.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG = "24.10"


def _compose(*args: str) -> str:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is not installed: `apt-get install -y docker-compose` (scripts/test.sh does it)"
    p = subprocess.run([exe, "-f", str(ROOT / "docker-compose.yml"), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"docker-compose {' '.join(args)} failed:\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def config() -> dict:
    """`docker-compose config` as JSON (YAML parsed by docker-compose's own interpreter, which has PyYAML)."""
    text = _compose("config")
    exe = shutil.which("docker-compose")
    interp = Path(exe).read_text(errors="replace").splitlines()[0].lstrip("#!").strip().split()
    p = subprocess.run([*interp, "-c", "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))"],
                       input=text, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_compose_file_is_valid():
    _compose("config", "-q")
    assert set(_compose("config", "--profiles").split()) == {"cpu", "gpu", "scale-out"}


@pytest.mark.parametrize("profile, server, gpu", [("gpu", "tritonserver", True), ("cpu", "tritonserver-cpu", False)])
def test_each_profile_has_a_server_a_repository_and_a_load_test(config, profile, server, gpu):
    services = {n: s for n, s in config["services"].items() if profile in s.get("profiles", [])}
    assert server in services, sorted(services)
    s = services[server]
    assert {(p["published"], p["target"]) for p in s["ports"]} == {(8000, 8000), (8001, 8001), (8002, 8002)}
    assert any(v.endswith("model_repository:/models:ro") for v in s["volumes"]), s["volumes"]
    assert "--model-repository=/models" in s["command"]
    build = s["build"]
    assert build["dockerfile"] == "deploy/Dockerfile" and build["args"]["TRITON_TAG"] == TAG
    ort = build["args"].get("ONNXRUNTIME", "onnxruntime-gpu")  # the Dockerfile's default is the GPU build
    devices = s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if gpu:
        assert ort.startswith("onnxruntime-gpu")
        assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    else:
        assert not ort.startswith("onnxruntime-gpu") and not devices
    # the repository is built (and profiled on the device) before the server starts
    (init,) = [n for n in s["depends_on"]]
    assert s["depends_on"][init]["condition"] == "service_completed_successfully"
    assert services[init]["command"][:3] == ["lazybatch", "repo", "default"]
    # perf_analyzer from the SDK image of the same release, against this server, once it is healthy
    (perf,) = [n for n, v in services.items() if v.get("image", "").endswith("-py3-sdk")]
    p = services[perf]
    assert p["image"] == f"nvcr.io/nvidia/tritonserver:{TAG}-py3-sdk"
    cmd = p["command"]
    assert cmd[0] == "perf_analyzer" and cmd[cmd.index("-u") + 1] == f"{server}:8001" and "--async" in cmd
    assert p["depends_on"] == {server: {"condition": "service_healthy"}}
    assert "healthcheck" in s


def test_dockerfile_pins_the_same_tag_and_installs_the_backend():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"ARG TRITON_TAG={TAG}" in text and "FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3" in text
    assert re.search(r"ARG ONNXRUNTIME=onnxruntime-gpu==\d", text)
    assert "--no-deps ." in text and "import lazybatch.backend.model" in text
    # the image gets every source folder pyproject maps into the package (a new folder must be copied too)
    pyproject = (ROOT / "pyproject.toml").read_text()
    package_dir = re.search(r"^package-dir = \{(.*)\}$", pyproject, flags=re.M).group(1)
    folders = set(re.findall(r'= "([\w/]+)"', package_dir))
    copied = set(re.findall(r"^COPY ([\w/]+) \./\1$", text, flags=re.M))
    assert folders and folders <= copied, folders - copied


def test_scale_out_profile_balances_two_replicas_with_the_recipes_nginx(config, tmp_path):
    """Two replicas of the CPU server on the one repository, unpublished; nginx (Debian's package) in front on 8000
    and 8001 with deploy/nginx-scale-out.conf, which is what lazybatch.scale_out generates for those names, and
    which nginx accepts (`nginx -t`, names swapped for 127.0.0.1 as no compose DNS runs here)."""
    from lazybatch import nginx as scale_out

    services = {n: s for n, s in config["services"].items() if "scale-out" in s.get("profiles", [])}
    replicas = list(scale_out.COMPOSE_REPLICAS)
    assert set(services) == {"model-repository-cpu", *replicas, "balancer", "perf-analyzer-scale-out"}, services
    for name in replicas:
        r = services[name]
        assert not r.get("ports") and "--model-repository=/models" in r["command"]
        assert any(v.endswith("model_repository:/models:ro") for v in r["volumes"]), r["volumes"]
        assert r["depends_on"] == {"model-repository-cpu": {"condition": "service_completed_successfully"}}
        assert "healthcheck" in r and r["build"]["args"]["ONNXRUNTIME"].startswith("onnxruntime==")
    b = services["balancer"]
    assert b["build"]["dockerfile"] == "deploy/nginx.Dockerfile"
    assert {(p["published"], p["target"]) for p in b["ports"]} == {(8000, 8000), (8001, 8001)}
    assert b["depends_on"] == {n: {"condition": "service_healthy"} for n in replicas}
    (conf_mount,) = [v for v in b["volumes"] if v.endswith(":/etc/lazybatch/nginx.conf:ro")]
    conf = ROOT / "deploy" / "nginx-scale-out.conf"
    assert conf_mount.startswith(str(conf)), conf_mount
    text = conf.read_text()
    assert text == scale_out.compose_nginx_config(), "regenerate: python -m lazybatch.nginx > " + str(conf)
    assert "grpc_pass grpc://triton_grpc;" in text
    dockerfile = (ROOT / "deploy" / "nginx.Dockerfile").read_text()
    assert "FROM debian:bookworm" in dockerfile and "apt-get install -y --no-install-recommends nginx" in dockerfile
    assert str(scale_out.COMPOSE_RUN_DIR / "tmp") in dockerfile and "/etc/lazybatch/nginx.conf" in dockerfile
    perf = services["perf-analyzer-scale-out"]["command"]
    assert perf[perf.index("-u") + 1] == "balancer:8001"

    local = text.replace(str(scale_out.COMPOSE_RUN_DIR), str(tmp_path)).replace("user www-data;\n", "")
    for name in replicas:
        local = local.replace(name, "127.0.0.1")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "nginx.conf").write_text(local)
    nginx = scale_out.find_nginx()
    p = subprocess.run([str(nginx), "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e",
                        str(tmp_path / "error.log")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
