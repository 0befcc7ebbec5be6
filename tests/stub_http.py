"""A scripted local HTTP server standing in for Herald (or a proxy in front of it) in client tests.

Each request takes the next `Step` of the script: an answer (status, headers, JSON body), a reset
connection, a hang, or `forward` to a real Herald (optionally answering something else afterwards, as
a proxy that lost Herald's answer would). Once the script is used up, requests are forwarded when an
upstream is set, else answered 202. Every request is recorded (method, path with query, headers, body).
"""
from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from http import HTTPStatus

import pytest
import requests

from testkit.local_server import LocalServer, QuietHandler


@dataclass
class Step:
    """One scripted answer: a status (with headers and a JSON body), a reset, a hang, or a forward."""
    status: int = 202
    body: dict = field(default_factory=lambda: {"id": "evt_stub"})
    headers: tuple[tuple[str, str], ...] = ()
    reset: bool = False
    hang: float = 0.0
    forward: bool = False  # send the request on to the upstream first; answer its answer unless status/reset say


def problem(status: int, code: str, *headers: tuple[str, str]) -> Step:
    return Step(status, {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
                         "detail": code, "code": code}, headers)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    upstream_status: int | None = None  # what the upstream answered, when the request was forwarded


class StubServer:
    """A local HTTP server answering from a script; `upstream` (a base URL) makes it a proxy."""

    def __init__(self, *steps: Step, port: int = 0, upstream: str | None = None):
        self.steps = list(steps)
        self.upstream = upstream
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        stub = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorded = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with stub.lock:
                    stub.requests.append(recorded)
                    step = stub.steps.pop(0) if stub.steps else Step(forward=stub.upstream is not None)
                status, data, headers = step.status, json.dumps(step.body).encode(), list(step.headers)
                ctype = "application/problem+json" if status >= 400 else "application/json"
                if step.forward:
                    answer = requests.request(self.command, stub.upstream + self.path, data=body, timeout=30,
                                              headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                                              allow_redirects=False)
                    recorded.upstream_status = answer.status_code
                    if step.status == 202 and not step.reset:  # a plain forward: Herald's answer as it is
                        status, data = answer.status_code, answer.content
                        ctype = answer.headers.get("Content-Type", "application/json")
                        headers = [(k, v) for k, v in answer.headers.items()
                                   if k.lower() not in ("content-length", "content-type", "connection",
                                                        "transfer-encoding", "date", "server")]
                if step.reset:  # RST instead of an answer: "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if step.hang:
                    stub.stopping.wait(step.hang)
                head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Type: {ctype}",
                        f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in headers)]
                try:
                    self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
                except OSError:
                    pass  # the client gave up waiting, as the test intended

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.server = LocalServer(Handler, port)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def keys(self) -> list[str | None]:
        return [recorded.headers.get("idempotency-key") for recorded in self.requests]

    def close(self):
        self.stopping.set()
        self.server.close()


@pytest.fixture
def stubs():
    """Make `StubServer`s in a test (`stubs(*steps, port=0)`); each is closed when the test ends."""
    made = []

    def make(*steps: Step, port: int = 0) -> StubServer:
        made.append(StubServer(*steps, port=port))
        return made[-1]

    yield make
    for stub in made:
        stub.close()
