"""``lazybatch serve``: run a real tritonserver on a model repository until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="start a Triton server (nvidia-pytriton's bundled tritonserver) on a model "
                       "repository", description=__doc__)
    p.add_argument("--model-repository", default="model_repository", help="model repository (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--tritonserver", default=None, help="a tritonserver binary (default: the nvidia-pytriton wheel's, "
                   "else one on PATH)")
    p.add_argument("--log-file", default="-", help="write the server log here (default -: the terminal)")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for readiness")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more tritonserver arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.serving import TritonServer

    extra = [a for a in args.extra if a != "--"]
    server = TritonServer(args.model_repository, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, binary=args.tritonserver, log_file=args.log_file,
                          log_verbose=args.log_verbose, extra_args=extra)
    print(f"starting {server.install.binary} on {server.repo} ...", flush=True)
    stop = {"now": False}

    def on_term(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    try:
        server.start(args.timeout)
        e = server.endpoints
        print(f"ready: gRPC {e.grpc}  HTTP {e.http}  metrics {e.metrics}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        while not stop["now"]:
            if server.proc is not None and server.proc.poll() is not None:
                print(f"tritonserver exited with code {server.proc.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping tritonserver ...", flush=True)
        code = server.stop()
        print(f"stopped (exit code {code})", flush=True)
    return 0
