"""Start a real ``tritonserver`` for a model repository of lazybatch models.

By default the server binary bundled in the nvidia-pytriton wheel is used; one on PATH (the NGC container's
``/opt/tritonserver``) works too. The Python backend needs a stub built for the running Python version, so a backend
directory is assembled (symlinks into the wheel) for it; the wheel's shared libraries go on LD_LIBRARY_PATH, and the
running interpreter's ``bin`` goes first on PATH so that the stub imports this environment's packages (lazybatch,
onnxruntime).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

from lazybatch.batcher.errors import ConfigError


@dataclass
class TritonInstall:
    """Where the server binary, the backend directory and its libraries are."""

    binary: Path
    backend_dir: Path
    lib_dir: Path | None  # extra LD_LIBRARY_PATH entry (the wheel's bundled libraries)


def _pytriton_root() -> Path | None:
    try:
        import pytriton  # type: ignore
    except ImportError:
        return None
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def assemble_backend_dir(root: Path, dest: Path | None = None) -> Path:
    """backends/python from the wheel + the stub for this Python version, as one backend directory."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.exists():
        have = sorted(p.name for p in (root / "python_backend_stubs").iterdir())
        raise ConfigError(f"nvidia-pytriton has no Python backend stub for Python {ver} (it has {have}); use one of "
                          "those Python versions for the virtualenv")
    dest = dest or Path(tempfile.gettempdir()) / f"lazybatch-backends-{os.getuid()}" / f"py{ver}"
    py = dest / "python"
    py.mkdir(parents=True, exist_ok=True)
    for src in [*(root / "backends" / "python").iterdir(), stub]:
        if src.name == "__pycache__":
            continue
        link = py / src.name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == src:
                continue
            link.unlink()
        link.symlink_to(src)
    return dest


def find_triton(binary: str | None = None) -> TritonInstall:
    """The bundled server unless ``binary`` (or, without the wheel, a ``tritonserver`` on PATH) is given."""
    if binary:
        b = Path(binary)
        if not b.exists():
            raise ConfigError(f"no tritonserver at {b}", field="--tritonserver")
        return TritonInstall(b, _backend_dir_near(b), None)
    root = _pytriton_root()
    if root is not None:
        libs = root.parent.parent / "nvidia_pytriton.libs"
        return TritonInstall(root / "bin" / "tritonserver", assemble_backend_dir(root),
                             libs if libs.is_dir() else None)
    found = shutil.which("tritonserver")
    if found:
        b = Path(found).resolve()
        return TritonInstall(b, _backend_dir_near(b), None)
    raise ConfigError("no Triton server found: install the serving extra (pip install 'lazybatch[serve]', which "
                      "brings nvidia-pytriton's tritonserver) or put tritonserver on PATH")


def _backend_dir_near(binary: Path) -> Path:
    for cand in (binary.parent.parent / "backends", Path("/opt/tritonserver/backends")):
        if (cand / "python").is_dir():
            return cand
    raise ConfigError(f"no backends/python directory next to {binary}")


_GIVEN_PORTS: "collections.deque[int]" = collections.deque(maxlen=4096)
_GIVEN_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and not one this process handed out recently: the OS may return the same
    free port to two calls before either is bound (seen: a replica's HTTP port and nginx's, the balancer then
    failing to bind while the replica answered in its place)."""
    with _GIVEN_LOCK:
        for _ in range(100):
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _GIVEN_PORTS:
                _GIVEN_PORTS.append(port)
                return port
    raise OSError(f"no free port on {host} that this process has not handed out already")


@dataclass
class Endpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


class TritonServer:
    """A running tritonserver process; a context manager that stops it on exit."""

    def __init__(self, model_repository: str | Path, *, host: str = "127.0.0.1", http_port: int = 8000,
                 grpc_port: int = 8001, metrics_port: int = 8002, binary: str | None = None,
                 log_file: str | Path | None = None, log_verbose: int = 0, extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, launcher: Sequence[str] = ()) -> None:
        """``launcher``: a command tritonserver runs under, which execs it in its place (``setpriv`` to run it as
        another user, ``prlimit`` for its limits, ``taskset`` for its cores): stopping the server stops both."""
        repo = Path(model_repository).resolve()
        if not repo.is_dir():
            raise ConfigError(f"model repository {repo} is not a directory; build one with `lazybatch repo add` "
                              "or scripts/quickstart.sh", field="--model-repository")
        self.repo = repo
        self.install = find_triton(binary)
        self.endpoints = Endpoints(host, http_port, grpc_port, metrics_port)
        self.inherit_output = str(log_file) == "-"  # "-": the server logs to this terminal
        self.log_file = Path(log_file) if log_file and not self.inherit_output else None
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.launcher = list(launcher)
        self.proc: subprocess.Popen | None = None
        self._log: IO | None = None

    def command(self) -> list[str]:
        e = self.endpoints
        return [*self.launcher, str(self.install.binary), f"--model-repository={self.repo}",
                f"--backend-directory={self.install.backend_dir}",
                f"--http-address={e.host}", f"--http-port={e.http_port}",
                f"--grpc-address={e.host}", f"--grpc-port={e.grpc_port}",
                f"--metrics-address={e.host}", f"--metrics-port={e.metrics_port}",
                "--allow-gpu-metrics=false", "--exit-timeout-secs=20", f"--log-verbose={self.log_verbose}",
                *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        if self.install.lib_dir is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (str(self.install.lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH", "")) if p)
        if sys.prefix != sys.base_prefix:
            env["VIRTUAL_ENV"] = sys.prefix
        return env

    def start(self, timeout: float = 180.0) -> "TritonServer":
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_file, "wb")  # one run per file: errors shown are this run's
            out: IO | int = self._log
        else:
            out = None if self.inherit_output else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        """Ready on HTTP and, unless metrics are off, answering on the metrics port: tritonserver starts its metrics
        service after HTTP, so a caller that scrapes right after HTTP says ready could find the port closed (seen in
        CI: tests/triton/test_ops_server.py got "connection refused" on its first scrape)."""
        urls = [f"http://{self.endpoints.http}/v2/health/ready"]
        if self.metrics_enabled:
            urls.append(self.endpoints.metrics)
        try:
            for url in urls:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status != 200:
                        return False
            return True
        except (urllib.error.URLError, OSError):
            return False

    @property
    def metrics_enabled(self) -> bool:
        return not any(a.replace(" ", "") in ("--allow-metrics=false", "--allow-metrics=0") for a in self.extra_args)

    def wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise ConfigError(f"tritonserver exited with code {self.proc.returncode} before it was ready"
                                  f"{self._log_hint()}")
            if self.ready():
                return
            time.sleep(0.25)
        raise ConfigError(f"tritonserver was not ready after {timeout:.0f} s{self._log_hint()}")

    def _log_hint(self) -> str:
        """The server's error lines (why a model did not load) and the end of its log."""
        if self.log_file is None or not self.log_file.exists():
            return ""
        lines = self.log_file.read_text(errors="replace").splitlines()
        errors = [l for l in lines if (l.startswith("E") and "CudaDriverHelper" not in l) or "UNAVAILABLE" in l][-12:]
        tail = [l for l in lines[-10:] if l not in errors]
        return f"; from its log ({self.log_file}):\n" + "\n".join(errors + ["..."] + tail)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT (Triton unloads models, so finalize answers held requests), then SIGKILL if it hangs."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return p.returncode

    def __enter__(self) -> "TritonServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
