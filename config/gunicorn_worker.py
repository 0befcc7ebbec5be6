"""gunicorn's threaded worker, with each request read whole before a thread takes it.

gunicorn's `gthread` worker gives a connection to a thread as soon as its first byte arrives, and the
thread then blocks until the request line, the headers and the body are in. A client that trickles
its headers or its body (slowloris) holds that thread for as long as it likes; a few such clients
hold every thread of every worker, and the API stops answering anyone (measured: 50 trickling
connections against 2 workers x 4 threads, `GET /healthz` from a sixth client timed out after 20 s).

This worker reads each request in the worker's event loop instead, next to the kept-alive
connections it already watches there, the way a buffering proxy (nginx) would: a thread only ever
gets a request whose head and body are already in memory, so it never waits on the client. Where a
request ends is decided by llhttp (config/http_reader.py), never by code of ours; gunicorn's own parser
then reads the same bytes in the thread. While reading, it refuses at once what would never be served:
- malformed framing (what llhttp's strict mode refuses, a transfer coding other than `chunked`, chunked
  on HTTP/1.0) or framing past its allowance: 400;
- a head (request line and headers) over WEB_MAX_HEADER_BYTES: 431, before reading further;
- a Content-Length over INTAKE_MAX_BODY_BYTES: 413, before reading the body; a chunked body as soon as
  more than that has arrived;
- a request not whole within WEB_CLIENT_TIMEOUT_SECONDS of its first byte: 408 (a connection that
  never sends anything is closed silently).
Each answer is problem+json with `Connection: close`, given without any thread, Django or database.
`Expect: 100-continue` is answered here, since the body is read here. See docs/http-reader.md.

TLS and HTTP/2 connections (neither is used by Herald; a proxy terminates TLS) take gthread's path
unchanged.
"""
from __future__ import annotations

import io
import json
import selectors
import socket
import time
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

from config.http_reader import Refusal, RequestReader

RECV_BYTES = 65536
REFUSALS = {
    # status: (reason phrase, problem code)
    400: ("Bad Request", "malformed_request"),
    408: ("Request Timeout", "request_timeout"),
    413: ("Content Too Large", "payload_too_large"),
    431: ("Request Header Fields Too Large", "request_header_fields_too_large"),
}


def refusal_bytes(status: int, detail: str) -> bytes:
    """The whole answer: the API's own problem+json body (intake/problems.py), and `Connection: close`."""
    from intake.problems import PROBLEM_CONTENT_TYPE, problem_body   # the app is loaded before any refusal

    reason, code = REFUSALS[status]
    body = json.dumps(problem_body(status_code=status, code=code, detail=detail), separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {PROBLEM_CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


class Pending:
    """One connection whose request is being read: its bytes, llhttp's reader of them, its deadline."""

    __slots__ = ("conn", "buf", "reader", "deadline")

    def __init__(self, conn, reader: RequestReader, deadline: float):
        self.conn = conn
        self.buf = bytearray()
        self.reader = reader
        self.deadline = deadline


class BufferedThreadWorker(ThreadWorker):
    """`gthread`, but a thread is given a request only once it is entirely read (see the module doc)."""

    def init_process(self):
        from django.conf import settings

        self.client_timeout = settings.WEB_CLIENT_TIMEOUT_SECONDS
        self.max_head = settings.WEB_MAX_HEADER_BYTES
        self.max_body = settings.INTAKE_MAX_BODY_BYTES
        self.pending: dict = {}   # conn -> Pending, in deadline order (one timeout for all)
        self.buffering = not self.cfg.is_ssl and "h2" not in self.cfg.http_protocols
        super().init_process()

    def enqueue_req(self, conn):
        if not self.buffering:
            return super().enqueue_req(conn)
        pending = Pending(conn, RequestReader(self.max_head, self.max_body), time.monotonic() + self.client_timeout)
        conn.sock.setblocking(False)
        # What gunicorn's parser left after the previous request (pipelined bytes) is read again first.
        data = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        if data and self._take(pending, data):
            return
        # A kept-alive connection comes here because it is readable: usually the whole request is
        # there already, and goes to a thread without ever being registered with the poller.
        if self._read(pending):
            return
        self.pending[conn] = pending
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, pending))

    def _on_readable(self, pending: Pending, _sock) -> None:
        self._read(pending)

    def _read(self, pending: Pending) -> bool:
        """Take what the socket holds; True when done with this connection's reading."""
        try:
            data = pending.conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._drop(pending)
            return True
        return self._take(pending, data)

    def _take(self, pending: Pending, data: bytes) -> bool:
        """Feed llhttp; hand the request to a thread once it is whole, or refuse it. True when done."""
        pending.buf += data
        reader = pending.reader
        try:
            whole = reader.feed(data)
        except Refusal as refusal:
            self._refuse(pending, refusal.status, refusal.detail)
            return True
        if not whole:
            if reader.waits_for_continue():
                reader.continue_sent = True
                try:
                    pending.conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError:
                    pass   # the next read finds out
            return False
        conn = pending.conn
        if self.pending.pop(conn, None) is not None:
            self.poller.unregister(conn.sock)
        conn.sock.setblocking(True)
        conn.init()
        conn.parser.unreader.unread(bytes(pending.buf))
        conn.data_ready = True
        super().enqueue_req(conn)
        return True

    def handle_request(self, req, conn):
        """In the thread, with the request already in memory. gunicorn's parser has decoded a chunked body
        from the buffered bytes; Django reads a WSGI body only up to CONTENT_LENGTH, so it is given one.
        `100 Continue` was answered (or was not needed) while the request was read."""
        if self.buffering:
            req._expected_100_continue = False
            if any(name == "TRANSFER-ENCODING" for name, _ in req.headers):
                body = req.body.read()
                req.headers = [(name, value) for name, value in req.headers if name != "TRANSFER-ENCODING"]
                req.headers.append(("CONTENT-LENGTH", str(len(body))))
                req.body = io.BytesIO(body)
        return super().handle_request(req, conn)

    def _refuse(self, pending: Pending, status: int, detail: str) -> None:
        self.log.info("Refused %s from %s: %s", status, _peer(pending.conn), detail)
        sock = pending.conn.sock
        try:
            sock.send(refusal_bytes(status, detail))
            # Half-close, and take what the client already sent: closing with unread bytes makes the kernel
            # send a reset, which can destroy the answer before the client reads it. Never waits: this is the
            # event loop (a client still sending its body may miss the answer; one that waits, as curl does
            # with `Expect: 100-continue`, gets it).
            sock.shutdown(socket.SHUT_WR)
            for _ in range(16):
                if not sock.recv(RECV_BYTES):
                    break
        except OSError:
            pass
        _count_refusal(status)
        self._drop(pending)

    def _drop(self, pending: Pending) -> None:
        conn = pending.conn
        if self.pending.pop(conn, None) is not None:
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self.pending:
            pending = next(iter(self.pending.values()))
            if pending.deadline > now:
                break
            if pending.buf:
                self._refuse(pending, 408, f"The request was not complete within {self.client_timeout:g} s.")
            else:
                self._drop(pending)

    def murder_keepalived(self, force=False):
        super().murder_keepalived(force)
        if force:   # the worker is stopping: requests still being read will not be served
            for pending in list(self.pending.values()):
                self._drop(pending)


def _peer(conn) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) else str(client)


def _count_refusal(status: int) -> None:
    from intake.metrics import http_refusals   # the app is loaded by the time anything is refused

    http_refusals.labels(str(status)).inc()
