"""Where a request ends, decided by llhttp (Node.js's HTTP/1.1 parser, through httptools) on the bytes the
buffered worker (config/gunicorn_worker.py) reads in its event loop. Nothing here parses HTTP framing:
llhttp finds the end of the head, of each chunk and of the body, and refuses malformed framing (a chunk
size that is not plain hex, a missing CRLF, Content-Length with Transfer-Encoding, a bare LF, ...) in its
strict mode; this class only adds Herald's limits and policies to what llhttp reports, in its callbacks:

- the first request's head is fed at most WEB_MAX_HEADER_BYTES at a time: not complete within it, 431;
- a request line longer than gunicorn's `limit_request_line` (4,094 bytes): 414, so that gunicorn's own
  parser, which would answer its HTML page, never meets one;
- a Content-Length, or body bytes decoded so far, over INTAKE_MAX_BODY_BYTES: 413;
- a transfer coding other than exactly `chunked` (`gzip, chunked`, `foo, chunked`, two Transfer-Encoding
  headers), or chunked on HTTP/1.0: 400 (llhttp itself refuses a coding list that does not end in chunked);
- an Upgrade (or CONNECT) request with a body: 400 (Herald never switches protocols, and llhttp would
  hand the body on as the new protocol's bytes);
- more than head limit + framing allowance (the head limit again) of bytes that are not body: the head,
  chunk size lines, chunk extensions and trailers: 400. So bytes on the wire are bounded by head limit +
  allowance + INTAKE_MAX_BODY_BYTES whatever the encoding: 64 MiB of chunk extensions, or a body in
  30,000 one-byte chunks, are refused after at most 32 KiB of framing (and one read of 64 KiB).

The work is linear in the bytes received: llhttp keeps its state between `feed()` calls and never looks
at a byte twice. Requests sent back to back (pipelining) are read together: `feed()` answers True when the
bytes so far are one or more whole requests and nothing else; gunicorn's parser then takes them one at a
time, and what it leaves comes back here to be read again. They share one request's size bound.
"""
from __future__ import annotations

import httptools


class Refusal(Exception):
    """The request must not be served: answered `status` with `detail`, and the connection closed."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


class RequestReader:
    """The bytes of one connection, fed as they arrive, from its first byte (or the first after the
    previous request) to the end of one or more whole requests."""

    __slots__ = ("parser", "max_head", "max_body", "max_framing", "max_wire", "max_url", "received", "in_first_head",
                 "started", "completed", "body", "bodies", "length", "codings", "expect_continue", "continue_sent",
                 "upgrade", "closes", "authorization", "url")

    def __init__(self, max_head: int, max_body: int, framing_allowance: int | None = None, max_line: int = 0):
        self.parser = httptools.HttpRequestParser(self)
        self.max_head = max_head
        self.max_body = max_body
        self.max_framing = max_head + (max_head if framing_allowance is None else framing_allowance)
        self.max_wire = self.max_framing + max_body
        # the longest target a request line of `max_line` bytes holds whatever its method ("OPTIONS", 7) and
        # version (" HTTP/1.1"): so every line refused by gunicorn's limit is refused here first; 0: no limit
        self.max_url = max_line - len("OPTIONS  HTTP/1.1") if max_line else 0
        self.url = 0              # bytes of the request target read so far (llhttp may give it in pieces)
        self.received = 0
        self.in_first_head = True
        self.started = 0          # requests begun, and ended (llhttp's on_message_begin/_complete)
        self.completed = 0
        self.body = 0             # body bytes of the request being read, decoded
        self.bodies = 0           # of every request so far
        self.length = None        # its Content-Length header values, and Transfer-Encoding's
        self.codings = None
        self.expect_continue = False   # the request being read waits for `100 Continue` (see `feed`)
        self.continue_sent = False     # set by the worker once it has answered that
        self.upgrade = False
        self.closes = False            # the last whole request ends the connection (HTTP/1.0, `Connection: close`)
        self.authorization = None      # the first request's Authorization header: whose turn it is (the worker)

    def feed(self, data: bytes) -> bool:
        """Take the next bytes received: True once everything received is whole requests; Refusal if
        the request must not be served. After True or a Refusal the reader is spent."""
        before = self.received
        self.received += len(data)
        try:
            if self.in_first_head and self.received > self.max_head:
                room = self.max_head - before
                view = memoryview(data)
                self.parser.feed_data(view[:room])
                if self.in_first_head:
                    raise Refusal(431, f"The request line and headers exceed {self.max_head} bytes.")
                self.parser.feed_data(view[room:])
            else:
                self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # llhttp stops after an Upgrade (or CONNECT) request without a body (one with a body is refused
            # in on_headers_complete): gunicorn does not switch protocols, so it answers it as a plain request,
            # and whatever follows comes back here as the next request.
            return True
        except httptools.HttpParserError as error:
            if isinstance(error.__context__, Refusal):
                raise error.__context__ from None
            if self.closes and self.completed == self.started:
                return True   # bytes after a request that ends the connection: it is answered, they are not read
            raise Refusal(400, f"The request is not valid HTTP/1.1: {error}.") from None
        if self.received - self.bodies > self.max_framing:
            raise Refusal(400, f"The head, chunk sizes, chunk extensions and trailers exceed {self.max_framing} bytes.")
        if self.received > self.max_wire:
            raise Refusal(413, f"Requests sent without waiting for answers exceed {self.max_wire} bytes.")
        return self.completed > 0 and self.completed == self.started

    def waits_for_continue(self) -> bool:
        """True when the client asked for `100 Continue` and the body is not complete yet."""
        return self.expect_continue and not self.continue_sent and self.completed < self.started

    # llhttp's callbacks ----------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.started += 1
        self.body = self.url = 0
        self.length = self.codings = None
        self.expect_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += len(url)
        if self.max_url and self.url > self.max_url:
            raise Refusal(414, f"The request target exceeds {self.max_url} bytes.")

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.length = value if self.length is None else self.length + b"," + value
        elif name == b"transfer-encoding":
            self.codings = value if self.codings is None else self.codings + b"," + value
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        elif name == b"authorization" and self.started == 1 and self.authorization is None:
            self.authorization = value

    def on_headers_complete(self) -> None:
        self.in_first_head = False
        if self.parser.get_http_version() not in ("1.1", "1.0"):
            raise Refusal(400, "Only HTTP/1.1 and HTTP/1.0 are served.")
        if self.codings is not None:
            if self.codings.strip(b" \t").lower() != b"chunked":
                raise Refusal(400, "The only transfer coding served is a single `chunked`.")
            if self.parser.get_http_version() == "1.0":
                raise Refusal(400, "A chunked body needs HTTP/1.1.")
        elif self.length is not None and int(self.length) > self.max_body:   # llhttp: digits, one value
            raise Refusal(413, f"The body is {int(self.length)} bytes; the limit is {self.max_body}.")
        if self.parser.should_upgrade():
            if self.codings is not None or (self.length is not None and int(self.length)):
                raise Refusal(400, "An Upgrade or CONNECT request with a body is not served.")
            self.upgrade = True

    def on_body(self, body: bytes) -> None:
        self.body += len(body)
        self.bodies += len(body)
        if self.body > self.max_body:
            raise Refusal(413, f"The body exceeds {self.max_body} bytes.")

    def on_message_complete(self) -> None:
        self.completed += 1
        self.closes = not self.parser.should_keep_alive()
