"""``lazybatch scale-out``: N tritonserver replicas of one model repository behind nginx (gRPC and HTTP) until
Ctrl-C; ``--drain I --run-dir DIR`` drains replica I of a running one without failing a client."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("scale-out", help="several Triton servers on one model repository behind an nginx load "
                       "balancer (gRPC grpc_pass, HTTP proxy_pass); or drain one of them", description=__doc__)
    p.add_argument("--replicas", type=int, default=2, help="tritonserver processes (default: %(default)s)")
    p.add_argument("--model-repository", default="model_repository", help="model repository every replica serves "
                   "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address of the balancer and the replicas "
                   "(default: %(default)s)")
    p.add_argument("--grpc-port", type=int, default=8001, help="the balancer's gRPC port (default: %(default)s; "
                   "0: a free one); replicas get free ports")
    p.add_argument("--http-port", type=int, default=8000, help="the balancer's HTTP port (default: %(default)s; "
                   "0: a free one)")
    p.add_argument("--run-dir", default=None, help="nginx.conf, logs, pid file and scale-out.json go here "
                   "(default: a new temporary directory); with --drain: the running scale-out's")
    p.add_argument("--tritonserver", default=None, help="a tritonserver binary (default: the nvidia-pytriton "
                   "wheel's, else one on PATH)")
    p.add_argument("--nginx", default=None, help="the nginx binary (default: nginx on PATH or in /usr/sbin)")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each replica's readiness")
    p.add_argument("--drain", type=int, default=None, metavar="I", help="drain replica I of the scale-out in "
                   "--run-dir: out of the balancer (reload), then SIGTERM (Triton finishes what it holds and exits)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more tritonserver arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.batcher.errors import ConfigError

    if args.drain is not None:
        if not args.run_dir:
            raise ConfigError("--drain needs the --run-dir that `lazybatch scale-out` printed", field="--run-dir")
        return run_drain(args)
    return run_serve(args)


def run_drain(args: argparse.Namespace) -> int:
    from lazybatch.scale_out import drain, read_state

    print(f"draining replica {args.drain}: out of the balancer, then SIGTERM ...", flush=True)
    pid = drain(args.run_dir, args.drain, wait=args.timeout)
    log = read_state(args.run_dir)["replicas"][args.drain]["log"]
    print(f"replica {args.drain} (pid {pid}) drained and stopped; its log: {log}", flush=True)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from lazybatch.scale_out import ScaleOut

    extra = [a for a in args.extra if a != "--"]
    so = ScaleOut(args.model_repository, args.replicas, host=args.host, grpc_port=args.grpc_port or None,
                  http_port=args.http_port or None, run_dir=args.run_dir, tritonserver=args.tritonserver,
                  nginx=args.nginx, log_verbose=args.log_verbose, extra_args=extra)
    print(f"starting {args.replicas} tritonserver replicas on {so.replicas[0].repo} (run directory {so.run_dir}) "
          "...", flush=True)
    stop = {"now": False}

    def on_term(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    gone: set[int] = set()
    try:
        so.start(args.timeout)
        for i, r in enumerate(so.replicas):
            e = r.endpoints
            print(f"  replica {i}: pid {r.proc.pid if r.proc else '?'}  gRPC {e.grpc}  HTTP {e.http}  metrics "
                  f"{e.metrics}  log {r.log_file}", flush=True)
        print(f"  nginx: pid {so.nginx.pid}  config {so.nginx.conf}  logs {so.nginx.log}, {so.nginx.access_log}",
              flush=True)
        print(f"ready: gRPC {so.grpc}  HTTP {so.http}  (balanced over {args.replicas} replicas)", flush=True)
        print(f"drain one: lazybatch scale-out --drain I --run-dir {so.run_dir}; press Ctrl-C to stop all",
              flush=True)
        while not stop["now"]:
            for i, alive in enumerate(so.alive()):
                if not alive and i not in gone:
                    gone.add(i)
                    code = so.replicas[i].proc.returncode if so.replicas[i].proc else None
                    print(f"replica {i} exited with code {code}", file=sys.stderr if code else sys.stdout,
                          flush=True)
                    so.take_out(i)  # a crash: nginx would skip it anyway (connection refused); a drain: done
            if len(gone) == len(so.replicas):
                print("every replica has exited; stopping nginx", file=sys.stderr)
                return 1
            if not so.nginx.running():
                print(f"nginx exited; see {so.nginx.log}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping nginx and the replicas ...", flush=True)
        codes = so.stop()
        print(f"stopped (replica exit codes {codes})", flush=True)
    return 0
