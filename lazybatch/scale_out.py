"""Scale-out on existing parts: N tritonserver replicas behind nginx as the gRPC (and HTTP) load balancer.

Where one server is not enough, run several (`lazybatch scale-out --replicas N`, docs/operations.md#scale-out):
each replica is a plain :class:`lazybatch.serving.TritonServer` on 127.0.0.1 free ports serving the same model
repository, and nginx (Debian's ``nginx`` package) balances over them: ``grpc_pass`` to an ``upstream`` of the
replicas' gRPC ports (HTTP/2), ``proxy_pass`` to their HTTP ports. nginx runs in the foreground (``daemon off``) on
a config generated into the run directory, with its pid file, logs and temp paths there too, so neither root nor
/etc/nginx is needed. ``RUN_DIR/scale-out.json`` records the replicas (pids, ports, which are out of the
balancer), so that another process (``lazybatch scale-out --drain I --run-dir RUN_DIR``) can drain one.

Draining, measured in tests/triton/test_scale_out.py: a replica sent SIGTERM (Triton's graceful shutdown) finishes
what it holds, but new requests that reach it meanwhile fail (NOT_FOUND while its models unload, CANCELLED as its
gRPC endpoint stops) and nginx cannot retry them: a gRPC error is an HTTP 200 with a ``grpc-status``, and
``grpc_next_upstream`` acts on connection errors and HTTP statuses only (it does skip the replica, unseen by
clients, once its port is closed). So :func:`drain` takes the replica out of the balancer first (``down`` + a
graceful reload, waiting until the old nginx workers finished the requests they were proxying) and only then sends
SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from lazybatch.batcher.errors import ConfigError
from lazybatch.serving import TritonServer, free_port
from lazybatch.nginx import Nginx, Upstream, alive, find_nginx, locked

STATE_FILE = "scale-out.json"


@dataclass
class ReplicaState:
    """A replica as recorded in RUN_DIR/scale-out.json."""

    index: int
    pid: int
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    log: str
    down: bool = False


def read_state(run_dir: str | Path) -> dict:
    path = Path(run_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"no scale-out state in {path} ({e}); give the --run-dir that `lazybatch scale-out` "
                          "printed") from None


def _write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(run_dir / STATE_FILE)


def set_down(run_dir: str | Path, index: int, down: bool = True, *, nginx: Nginx | None = None) -> None:
    """Take replica ``index`` out of (or back into) the balancer: state, nginx.conf, reload, under one lock.

    The state file is read under the lock, so the supervisor and a `--drain` process never undo each other."""
    run_dir = Path(run_dir).resolve()
    with locked(run_dir):
        state = read_state(run_dir)
        reps = [ReplicaState(**r) for r in state["replicas"]]
        if not 0 <= index < len(reps):
            raise ConfigError(f"no replica {index}: this scale-out has replicas 0-{len(reps) - 1}", field="--drain")
        reps[index].down = down
        if all(r.down for r in reps):
            raise ConfigError(f"replica {index} is the last one in the balancer: stop the whole scale-out instead "
                              "(Ctrl-C on `lazybatch scale-out`)")
        n = nginx or Nginx(run_dir, [], host=state["host"], grpc_port=state["grpc_port"],
                           http_port=state["http_port"], binary=state["nginx"])
        n.upstreams = [Upstream(r.host, r.grpc_port, r.http_port, r.down) for r in reps]
        n.write_config()
        n.reload()
        state["replicas"] = [asdict(r) for r in reps]
        _write_state(run_dir, state)


def drain(run_dir: str | Path, index: int, *, nginx: Nginx | None = None, balancer_first: bool = True,
          wait: float | None = None) -> int | None:
    """Stop replica ``index`` without failing a client: out of the balancer, then SIGTERM (Triton's graceful
    shutdown: it finishes what it holds, then exits). With ``wait``, wait that long for it to exit.

    ``balancer_first=False`` sends only the SIGTERM: what nginx alone does with a draining replica (the test
    measures it; clients then see errors they must retry). Returns the replica's pid."""
    run_dir = Path(run_dir).resolve()
    reps = read_state(run_dir)["replicas"]
    if not 0 <= index < len(reps):
        raise ConfigError(f"no replica {index}: this scale-out has replicas 0-{len(reps) - 1}", field="--drain")
    rep = ReplicaState(**reps[index])
    if balancer_first:
        set_down(run_dir, index, nginx=nginx)
    if not alive(rep.pid):
        return rep.pid
    os.kill(rep.pid, signal.SIGTERM)
    if wait is not None:
        end = time.monotonic() + wait
        while alive(rep.pid):
            if time.monotonic() > end:
                raise ConfigError(f"replica {index} (pid {rep.pid}) still runs {wait:.0f} s after SIGTERM; see "
                                  f"{rep.log}")
            time.sleep(0.1)
    return rep.pid


class ScaleOut:
    """N replicas of one model repository and nginx in front; a context manager that stops all of them.

    Each replica logs to ``run_dir/replica-<i>.log``; ``env`` goes to every replica and ``replica_env[i]`` adds
    per-replica variables (the test gives each its own LAZYBATCH_STATS_DIR)."""

    def __init__(self, model_repository: str | Path, replicas: int = 2, *, host: str = "127.0.0.1",
                 grpc_port: int | None = None, http_port: int | None = None, run_dir: str | Path | None = None,
                 tritonserver: str | None = None, nginx: str | None = None, log_verbose: int = 0,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 replica_env: dict[int, dict[str, str]] | None = None) -> None:
        if replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, not {replicas}", field="--replicas")
        nginx_binary = find_nginx(nginx)  # before anything starts: say what to install first
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="lazybatch-scale-out-")).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.replicas: list[TritonServer] = []
        for i in range(replicas):
            e = {**(env or {}), **(replica_env or {}).get(i, {})}
            self.replicas.append(TritonServer(
                model_repository, host=host, http_port=free_port(host), grpc_port=free_port(host),
                metrics_port=free_port(host), binary=tritonserver, log_file=self.run_dir / f"replica-{i}.log",
                log_verbose=log_verbose, extra_args=extra_args, env=e))
        ups = [Upstream(host, r.endpoints.grpc_port, r.endpoints.http_port) for r in self.replicas]
        self.nginx = Nginx(self.run_dir, ups, host=host, grpc_port=grpc_port or free_port(host),
                           http_port=http_port or free_port(host), binary=str(nginx_binary))

    @property
    def grpc(self) -> str:
        """The balanced gRPC endpoint (host:port) clients use."""
        return self.nginx.grpc

    @property
    def http(self) -> str:
        """The balanced HTTP endpoint (host:port)."""
        return self.nginx.http

    def start(self, timeout: float = 300.0) -> "ScaleOut":
        """Start the replicas (one after another: each loads every model), then nginx; all stopped on failure."""
        try:
            for r in self.replicas:
                r.start(timeout)
            self.nginx.start()
            self._save_state()
            self.wait_ready(timeout=30.0)
        except BaseException:
            self.stop()
            raise
        return self

    def _save_state(self) -> None:
        reps = [ReplicaState(i, r.proc.pid if r.proc else -1, r.endpoints.host, r.endpoints.grpc_port,
                             r.endpoints.http_port, r.endpoints.metrics_port, str(r.log_file), u.down)
                for i, (r, u) in enumerate(zip(self.replicas, self.nginx.upstreams))]
        state = {"host": self.nginx.host, "grpc_port": self.nginx.grpc_port, "http_port": self.nginx.http_port,
                 "nginx": str(self.nginx.binary), "replicas": [asdict(r) for r in reps]}
        with locked(self.run_dir):
            _write_state(self.run_dir, state)

    def wait_ready(self, timeout: float) -> None:
        """Until the balanced HTTP endpoint says ready (nginx proxies to a ready replica)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://{self.http}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ConfigError(f"the balancer at {self.http} did not answer ready after {timeout:.0f} s; see "
                          f"{self.nginx.log}")

    def drain(self, index: int, *, balancer_first: bool = True, wait: float | None = None) -> None:
        """:func:`drain` on this scale-out's replica ``index``."""
        drain(self.run_dir, index, nginx=self.nginx, balancer_first=balancer_first, wait=wait)

    def take_out(self, index: int) -> None:
        """Mark a replica that stopped (crashed or drained from outside) down in nginx, if it is not already."""
        state = read_state(self.run_dir)
        if not state["replicas"][index]["down"] and not all(
                r["down"] for i, r in enumerate(state["replicas"]) if i != index):
            set_down(self.run_dir, index, nginx=self.nginx)

    def alive(self) -> list[bool]:
        return [r.proc is not None and r.proc.poll() is None for r in self.replicas]

    def stop(self) -> list[int | None]:
        """nginx first (no new requests), then every replica (SIGINT: Triton answers what it holds)."""
        try:
            self.nginx.stop()
        finally:
            codes = []
            for r in self.replicas:
                try:
                    codes.append(r.stop())
                except Exception:  # stop every other replica even if one misbehaves
                    codes.append(None)
        return codes

    def __enter__(self) -> "ScaleOut":
        return self.start() if self.nginx.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
