"""TritonServer.ready waits for the metrics port as well as HTTP: tritonserver starts its metrics service after HTTP,
and a CI run once scraped metrics right after HTTP said ready and got "connection refused"."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lazybatch.serving import TritonServer, free_port


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def _serve(port: int) -> ThreadingHTTPServer:
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_ready_needs_the_metrics_port_to_answer_unless_metrics_are_off(tmp_path):
    http_port, metrics_port = free_port(), free_port()
    server = TritonServer(tmp_path, http_port=http_port, grpc_port=free_port(), metrics_port=metrics_port)
    no_metrics = TritonServer(tmp_path, http_port=http_port, grpc_port=free_port(), metrics_port=metrics_port,
                              extra_args=["--allow-metrics=false"])
    http = _serve(http_port)
    try:
        assert not server.ready(), "HTTP answers but the metrics port is closed: not ready yet"
        assert no_metrics.ready(), "with metrics off, HTTP alone is enough"
        metrics = _serve(metrics_port)
        try:
            assert server.ready()
        finally:
            metrics.shutdown()
            metrics.server_close()
    finally:
        http.shutdown()
        http.server_close()
