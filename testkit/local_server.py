"""A local HTTP server on its own thread, for the receivers, token servers and stubs the tests run.

Each of them keeps its own handler (what it records and answers); starting it on 127.0.0.1, serving from a
daemon thread, staying quiet about clients that hang up, and stopping it live here once.
"""
from __future__ import annotations

import http.server
import ssl
import threading


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that logs nothing: the servers record what a test reads."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class LocalServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer on 127.0.0.1:`port` (0: a free one) serving from a daemon thread as soon as it
    is made; `close()` stops it. A client hanging up mid-answer (a sender giving up on a slow answer, a
    refused TLS handshake) is part of the tests, so `handle_error` is quiet.

    `backlog` raises the listen queue (the default 5 makes a burst of connections wait for SYN retries);
    `tls` wraps the listening socket in that server-side context."""

    daemon_threads = True

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], port: int = 0, *,
                 backlog: int | None = None, tls: ssl.SSLContext | None = None) -> None:
        if backlog is not None:
            self.request_queue_size = backlog  # read by listen() inside the constructor
        super().__init__(("127.0.0.1", port), handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.port: int = self.server_address[1]
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def handle_error(self, request, client_address) -> None:
        pass

    def close(self) -> None:
        self.shutdown()
        self.server_close()
