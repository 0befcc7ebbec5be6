"""Slow and odd HTTP clients, on raw sockets: slowloris (headers trickled), slow bodies, oversized heads.

Used by the black-box `slow-clients` scenario and by tests/test_slow_clients.py.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from blackbox.checks import percentile

HEAD_START = b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@dataclass
class Trickle:
    """What one trickling connection saw: when it began, what status the server answered, when it was cut."""
    started: float = 0.0
    status: int | None = None
    cut_after: float | None = None   # seconds from the first byte to the server closing or answering
    error: str = ""


class Trickler(threading.Thread):
    """Opens a connection, sends `first`, then one `piece` every `interval` seconds until the server answers or
    closes (or `stop()`); records the answer's status and how long the server let it go on."""

    def __init__(self, host: str, port: int, first: bytes, piece: bytes, interval: float):
        super().__init__(daemon=True)
        self.address = (host, port)
        self.first, self.piece, self.interval = first, piece, interval
        self.result = Trickle()
        self.opened = threading.Event()   # set once `first` is sent (or the connection failed): the attack is on
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
        except OSError as exc:
            self.result.error = f"connect: {exc}"
            self.opened.set()
            return
        with sock:
            self.result.started = time.monotonic()
            try:
                sock.sendall(self.first)
                self.opened.set()
                sock.settimeout(self.interval)
                while not self._stop_event.is_set():
                    try:
                        answer = sock.recv(4096)
                    except socket.timeout:
                        sock.sendall(self.piece)
                        continue
                    self._finish(answer)
                    return
            except OSError as exc:   # reset by the server: cut
                self._finish(b"")
                self.result.error = repr(exc)
            finally:
                self.opened.set()

    def _finish(self, answer: bytes) -> None:
        self.result.cut_after = time.monotonic() - self.result.started
        self.result.status = status_of(answer)

    def stop(self) -> None:
        self._stop_event.set()


def all_opened(tricklers: list[Trickler], timeout: float = 30) -> None:
    """Wait until every trickler has sent its first bytes (or failed to connect); TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    for trickler in tricklers:
        if not trickler.opened.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"a trickling connection did not open within {timeout:g} s")


def status_of(answer: bytes) -> int | None:
    """The status code of an HTTP/1.1 answer's first line (None for no answer)."""
    parts = answer.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return None


def header_tricklers(host: str, port: int, count: int, interval: float = 1.0) -> list[Trickler]:
    """Slowloris: a request line and one header, then another header every `interval` s, never the blank line."""
    return [Trickler(host, port, HEAD_START, b"X-Trickle: %d\r\n" % i, interval) for i in range(count)]


def body_tricklers(host: str, port: int, count: int, interval: float = 1.0, length: int = 100_000) -> list[Trickler]:
    """A whole head announcing `length` bytes of JSON, then one byte of body every `interval` s."""
    head = HEAD_START + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n{" % length
    return [Trickler(host, port, head, b" ", interval) for _ in range(count)]


@dataclass
class Answer:
    status: int | None
    seconds: float
    head: bytes = b""


def exchange(host: str, port: int, request: bytes, *, then: list[tuple[float, bytes]] = (),
             timeout: float = 30) -> Answer:
    """Send `request`, then each `then` piece after its delay unless the server has answered meanwhile; return
    the answer's head and how long it took to come. A send the server refuses (it answered and closed while
    the client was still sending) is not an error: the answer is what counts."""
    started = time.monotonic()
    head = b""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(request)
            for delay, piece in then:
                sock.settimeout(delay)
                try:
                    head = sock.recv(65536)
                    break   # an answer, or the server closed
                except socket.timeout:
                    sock.sendall(piece)
            else:
                head = None
        except OSError:
            head = None
        sock.settimeout(timeout)
        head = head or b""
        try:
            while b"\r\n\r\n" not in head:
                data = sock.recv(65536)
                if not data:
                    break
                head += data
        except OSError:
            pass
    return Answer(status_of(head), time.monotonic() - started, head)


@dataclass
class Probe:
    """Latencies of normal requests made while something else goes on."""
    seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def p(self, q: float) -> float:
        return percentile(self.seconds, q * 100) if self.seconds else float("inf")


class Siege(threading.Thread):
    """Keeps `heads` header tricklers and `bodies` body tricklers open against one server, opening a new one as
    each is cut (as a real slowloris does), until `stop()`; `finished` holds what every cut one saw."""

    def __init__(self, host: str, port: int, heads: int, bodies: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.host, self.port, self.heads, self.bodies, self.interval = host, port, heads, bodies, interval
        self.finished: list[Trickle] = []
        self.opened = 0
        self._stop_event = threading.Event()

    def _new(self, kind: str) -> Trickler:
        make = header_tricklers if kind == "head" else body_tricklers
        trickler = make(self.host, self.port, 1, self.interval)[0]
        trickler.kind = kind
        trickler.start()
        self.opened += 1
        return trickler

    def run(self) -> None:
        live = [self._new("head") for _ in range(self.heads)] + [self._new("body") for _ in range(self.bodies)]
        while not self._stop_event.wait(0.1):
            for i, trickler in enumerate(live):
                if not trickler.is_alive():
                    self.finished.append(trickler.result)
                    live[i] = self._new(trickler.kind)
        for trickler in live:
            trickler.stop()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)
