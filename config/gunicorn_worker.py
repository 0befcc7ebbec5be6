"""gunicorn's threaded worker, with each request read whole before a thread takes it.

gunicorn's `gthread` worker gives a connection to a thread as soon as its first byte arrives, and the
thread then blocks until the request line, the headers and the body are in. A client that trickles
its headers or its body (slowloris) holds that thread for as long as it likes; a few such clients
hold every thread of every worker, and the API stops answering anyone (measured: 50 trickling
connections against 2 workers x 4 threads, `GET /healthz` from a sixth client timed out after 20 s).

This worker reads each request in the worker's event loop instead, next to the kept-alive
connections it already watches there, the way a buffering proxy (nginx) would: a thread only ever
gets a request whose head and body are already in memory, so it never waits on the client. While
reading, it refuses at once what would never be served:
- a head (request line and headers) over WEB_MAX_HEADER_BYTES: 431, before reading further;
- a Content-Length (or chunked body) over INTAKE_MAX_BODY_BYTES: 413, before reading the body;
- a request not whole within WEB_CLIENT_TIMEOUT_SECONDS of its first byte: 408 (a connection that
  never sends anything is closed silently).
Each answer is problem+json with `Connection: close`, given without any thread, Django or database.
`Expect: 100-continue` is answered here, since the body is read here.

Anything the reader does not understand is handed on as it is, for gunicorn's own parser to refuse
with its usual 400. TLS and HTTP/2 connections (neither is used by Herald; a proxy terminates TLS)
take gthread's path unchanged.
"""
from __future__ import annotations

import json
import selectors
import socket
import time
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

CRLF2 = b"\r\n\r\n"
RECV_BYTES = 65536
REFUSALS = {
    # status: (reason phrase, problem code)
    408: ("Request Timeout", "request_timeout"),
    413: ("Content Too Large", "payload_too_large"),
    431: ("Request Header Fields Too Large", "request_header_fields_too_large"),
}


class Refusal(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def refusal_bytes(status: int, detail: str) -> bytes:
    """The whole answer: the API's own problem+json body (intake/problems.py), and `Connection: close`."""
    from intake.problems import PROBLEM_CONTENT_TYPE, problem_body   # the app is loaded before any refusal

    reason, code = REFUSALS[status]
    body = json.dumps(problem_body(status_code=status, code=code, detail=detail), separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {PROBLEM_CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


class RequestReader:
    """One request being read on a non-blocking socket; `complete()` says whether it is all in."""

    __slots__ = ("conn", "buf", "deadline", "head_end", "body_length", "chunked", "max_head", "max_body")

    def __init__(self, conn, data: bytes, deadline: float, max_head: int, max_body: int):
        self.conn = conn
        self.buf = bytearray(data)
        self.deadline = deadline
        self.head_end = -1        # index just past the blank line ending the head
        self.body_length = 0      # Content-Length, when not chunked
        self.chunked = False
        self.max_head = max_head
        self.max_body = max_body

    def complete(self) -> bool:
        """True once the head and the whole body are buffered; Refusal if it must not be served."""
        if self.head_end < 0:
            end = self.buf.find(CRLF2)
            if end < 0:
                if len(self.buf) > self.max_head:
                    raise Refusal(431, f"The request line and headers exceed {self.max_head} bytes.")
                return False
            if end + 4 > self.max_head:
                raise Refusal(431, f"The request line and headers exceed {self.max_head} bytes.")
            self.head_end = end + 4
            if not self._read_framing():
                return True   # gunicorn's parser refuses what this cannot frame (400)
        if self.chunked:
            return self._chunked_complete()
        return len(self.buf) >= self.head_end + self.body_length

    def _read_framing(self) -> bool:
        """Content-Length / Transfer-Encoding / Expect from the head; False if they are malformed."""
        lengths, codings, expects_continue = set(), [], False
        for line in bytes(self.buf[:self.head_end - 4]).split(b"\r\n")[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                return False
            name = name.strip().lower()
            if name == b"content-length":
                lengths.add(value.strip())
            elif name == b"transfer-encoding":
                codings.append(value.strip().lower())
            elif name == b"expect" and value.strip().lower() == b"100-continue":
                expects_continue = True
        if codings:
            codings = [coding.strip() for value in codings for coding in value.split(b",")]
            if lengths or codings[-1] != b"chunked":
                return False   # gunicorn answers 400 or 501 without reading a body
            self.chunked = True
        elif lengths:
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                return False
            self.body_length = int(next(iter(lengths)))
            if self.body_length > self.max_body:
                raise Refusal(413, f"The body is {self.body_length} bytes; the limit is {self.max_body}.")
        if expects_continue and (self.chunked or len(self.buf) < self.head_end + self.body_length):
            self._strip_expect()
            self.conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _head_without(self, name: bytes, extra: bytes = b"") -> bytes:
        """The head with every `name:` header line dropped and `extra` lines added."""
        kept = [line for line in bytes(self.buf[:self.head_end - 4]).split(b"\r\n")
                if not line.lower().startswith(name + b":")]
        return b"\r\n".join(kept) + extra + CRLF2

    def _strip_expect(self) -> None:
        """Answered here, so gunicorn must not answer `Expect: 100-continue` a second time."""
        head = self._head_without(b"expect")
        self.buf[:self.head_end] = head
        self.head_end = len(head)

    def _chunked_complete(self) -> bool:
        pos, pieces = self.head_end, []
        while True:
            line_end = self.buf.find(b"\r\n", pos)
            if line_end < 0:
                return False
            size_text = bytes(self.buf[pos:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                return True   # malformed: gunicorn's parser answers 400
            if size == 0:
                trailer_start = line_end + 2
                if self.buf[trailer_start:trailer_start + 2] == b"\r\n":
                    end = trailer_start + 2
                else:
                    end = self.buf.find(CRLF2, trailer_start - 2)
                    if end < 0:
                        return False
                    end += 4
                self._unchunk(pieces, end)
                return True
            if sum(length for _, length in pieces) + size > self.max_body:
                raise Refusal(413, f"The chunked body exceeds {self.max_body} bytes.")
            pieces.append((line_end + 2, size))
            pos = line_end + 2 + size + 2
            if pos > len(self.buf):
                return False

    def _unchunk(self, pieces: list[tuple[int, int]], end: int) -> None:
        """Rewrite a whole chunked request with a Content-Length: Django reads a WSGI body only up to
        CONTENT_LENGTH, so a chunked body would otherwise reach the view empty. Trailers are dropped."""
        body = b"".join(bytes(self.buf[start:start + length]) for start, length in pieces)
        head = self._head_without(b"transfer-encoding", b"\r\nContent-Length: %d" % len(body))
        self.buf[:end] = head + body
        self.head_end = len(head)
        self.chunked = False


class BufferedThreadWorker(ThreadWorker):
    """`gthread`, but a thread is given a request only once it is entirely read (see the module doc)."""

    def init_process(self):
        from django.conf import settings

        self.client_timeout = settings.WEB_CLIENT_TIMEOUT_SECONDS
        self.max_head = settings.WEB_MAX_HEADER_BYTES
        self.max_body = settings.INTAKE_MAX_BODY_BYTES
        self.readers: dict = {}   # conn -> RequestReader, in deadline order (one timeout for all)
        self.buffering = not self.cfg.is_ssl and "h2" not in self.cfg.http_protocols
        super().init_process()

    def enqueue_req(self, conn):
        if not self.buffering:
            return super().enqueue_req(conn)
        data = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        reader = RequestReader(conn, data, time.monotonic() + self.client_timeout, self.max_head, self.max_body)
        conn.sock.setblocking(False)
        # A kept-alive connection comes here because it is readable: usually the whole request is
        # there already, and goes to a thread without ever being registered with the poller.
        if self._read(reader) or self._advance(reader):
            return
        self.readers[conn] = reader
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, reader))

    def _on_readable(self, reader: RequestReader, _sock) -> None:
        if not self._read(reader):
            self._advance(reader)

    def _read(self, reader: RequestReader) -> bool:
        """Take what the socket holds; True if the client has gone (the connection is then closed)."""
        try:
            data = reader.conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._drop(reader)
            return True
        reader.buf += data
        return False

    def _advance(self, reader: RequestReader) -> bool:
        """Hand the request to a thread if it is whole, or refuse it; True when done with reading."""
        try:
            if not reader.complete():
                return False
        except Refusal as refusal:
            self._refuse(reader, refusal.status, refusal.detail)
            return True
        conn = reader.conn
        if conn in self.readers:
            del self.readers[conn]
            self.poller.unregister(conn.sock)
        conn.sock.setblocking(True)
        conn.init()
        conn.parser.unreader.unread(bytes(reader.buf))
        conn.data_ready = True
        super().enqueue_req(conn)
        return True

    def _refuse(self, reader: RequestReader, status: int, detail: str) -> None:
        self.log.info("Refused %s from %s: %s", status, _peer(reader.conn), detail)
        sock = reader.conn.sock
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
        self._drop(reader)

    def _drop(self, reader: RequestReader) -> None:
        conn = reader.conn
        if self.readers.pop(conn, None) is not None:
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self.readers:
            reader = next(iter(self.readers.values()))
            if reader.deadline > now:
                break
            if reader.buf:
                self._refuse(reader, 408, f"The request was not complete within {self.client_timeout:g} s.")
            else:
                self._drop(reader)

    def murder_keepalived(self, force=False):
        super().murder_keepalived(force)
        if force:   # the worker is stopping: requests still being read will not be served
            for reader in list(self.readers.values()):
                self._drop(reader)


def _peer(conn) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) else str(client)


def _count_refusal(status: int) -> None:
    from intake.metrics import http_refusals   # the app is loaded by the time anything is refused

    http_refusals.labels(str(status)).inc()
