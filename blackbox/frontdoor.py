"""The front door's attacks (issue 21): HTTP framing that a hand-written reader got wrong, on raw sockets, each
reading the whole answer and whether the server closed. Used by tests/test_front_door.py and the black-box
`front-door` scenario."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class Answer:
    status: int | None
    head: bytes
    body: bytes
    closed: bool       # the server closed the connection after its answer
    seconds: float     # from the first byte sent to the connection's close


def ask(address, request: bytes, pieces: list[bytes] = (), hold: float = 0, timeout: float = 10) -> Answer:
    """Send `request`, then each of `pieces` while the server has not answered; read the answer and whether the
    server then closes (a reset counts as closed). `hold`: keep the connection open this long after sending,
    before reading."""
    started = time.monotonic()
    data, closed = b"", False
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(request)
            for piece in pieces:
                sock.settimeout(0.005)
                try:
                    data = sock.recv(65536)
                    break   # answered (or closed): stop sending
                except socket.timeout:
                    sock.settimeout(timeout)
                    sock.sendall(piece)
        except OSError:
            pass
        time.sleep(hold)
        sock.settimeout(timeout)
        try:
            while more := sock.recv(65536):   # every answer here ends with the server closing
                data += more
            closed = True
        except OSError:
            closed = True
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None
    return Answer(status, head, body, closed, time.monotonic() - started)



class Attack(threading.Thread):
    """Sends one request again and again, `count` connections at a time, each held open `hold` s after sending."""

    def __init__(self, address, make, count: int, pieces=lambda: (), hold: float = 0.3):
        super().__init__(daemon=True)
        self.address, self.make, self.count, self.pieces, self.hold = address, make, count, pieces, hold
        self.answers: list[Answer] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self):
        def one():
            while not self._stop_event.is_set():
                try:
                    self.answers.append(ask(self.address, self.make(), self.pieces(), hold=self.hold))
                except OSError as exc:
                    self.errors.append(repr(exc))
        threads = [threading.Thread(target=one, daemon=True) for _ in range(self.count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def stop(self):
        self._stop_event.set()
        self.join(30)


EVENT = b'{"type": "front.door", "data": {"invoice": "in_1"}}'
CHUNKED = b"Transfer-Encoding: chunked\r\n"


def attacks(head) -> dict[str, tuple]:
    """name -> (connections at once, request maker, pieces maker): `head(framing)` gives a request head."""
    one_byte_chunks = b"".join(b"1\r\n%s\r\n" % EVENT[i % len(EVENT):i % len(EVENT) + 1] for i in range(30_000))
    extension = b"a" * (1 << 20)
    return {
        "negative chunk size x8": (8, lambda: head(CHUNKED) + b"-6\r\n" + EVENT + b"\r\n0\r\n\r\n", lambda: ()),
        "30,000 one-byte chunks x4": (4, lambda: head(CHUNKED) + one_byte_chunks + b"0\r\n\r\n", lambda: ()),
        "4 MiB chunk extension": (1, lambda: head(CHUNKED) + b"1;x=", lambda: [extension] * 4),
        "CL.TE smuggle": (1, lambda: head(CHUNKED + b"Content-Length: 60\r\n") +
                          b"0\r\n\r\nPOST /api/v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", lambda: ()),
        "Transfer-Encoding: foo, chunked": (1, lambda: head(b"Transfer-Encoding: foo, chunked\r\n") +
                                            b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT), lambda: ()),
    }
