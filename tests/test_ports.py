"""Ports handed to servers and the balancer: never the same one twice, and a balancer that cannot bind says so.

A suite run under a busy core once gave a replica's HTTP port to nginx as well: nginx failed to bind while the
replica answered on the port, so the balancer looked up and the test waited a minute for requests that went
nowhere (docs/operations.md#tests).
"""

from __future__ import annotations

import socket

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.nginx import Nginx, Upstream, find_nginx
from lazybatch.serving import free_port


def test_free_port_never_hands_out_the_same_port_twice():
    # without the check, 600 draws here repeated 12-18 ports (the OS does not draw them uniformly); the process
    # remembers the last 4,096 it gave, and earlier tests in the suite drew some already
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


def test_nginx_that_cannot_bind_fails_to_start_even_where_another_process_listens(tmp_path):
    try:
        find_nginx()
    except ConfigError as e:  # as the scale-out tests: a missing nginx is a failed setup, not a skip
        pytest.fail(f"{e} (scripts/test.sh installs it)")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ng = Nginx(tmp_path, [Upstream("127.0.0.1", free_port(), free_port())], grpc_port=free_port(),
                   http_port=port)
        try:
            with pytest.raises(ConfigError, match="nginx cannot start.*Address already in use"):
                ng.start(timeout=10)
            assert ng.proc is not None and ng.proc.poll() is not None, "the failed nginx was left running"
        finally:
            ng.stop()  # where start wrongly succeeded: nginx would bind once the port is free again
