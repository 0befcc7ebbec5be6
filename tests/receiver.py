"""A real webhook receiver for tests: a threaded HTTP server on 127.0.0.1 with scripted answers."""
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from http import HTTPStatus

from testkit.local_server import LocalServer, QuietHandler


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int = 200  # what the receiver answered (or will, after its scripted delay)

    @property
    def answered_ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b"ok"
    delay: float = 0.0


def wait_for_count(changed: threading.Condition, got, count: int, timeout: float, what: str) -> list:
    """Wait on `changed` until `got()` (called under it) holds `count` items; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    with changed:
        while True:
            found = got()
            if len(found) >= count:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"expected {count} {what}, got {len(found)}")
            changed.wait(remaining)


class Receiver:
    """Records every request; answers from a per-path script, then with `default_answer` (200)."""

    def __init__(self):
        self.received: list[Received] = []
        self._script: dict[str, deque[Answer]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight: dict[str, int] = defaultdict(int)  # by webhook-id
        self.path_in_flight: dict[str, int] = defaultdict(int)
        self.path_max_in_flight: dict[str, int] = defaultdict(int)  # by path (one endpoint each)
        self.closing = threading.Event()
        self.default_answer = Answer()  # when a path's script is empty: a test may set it (e.g. 500: "down")
        self.path_default: dict[str, Answer] = {}  # the same for one path (tests/sinks.py's down and hang)
        self.on_request = None  # called with each Received as it arrives (tests/sinks.py)
        receiver = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                msg_id = headers.get("webhook-id", "")
                with receiver._changed:
                    script = receiver._script[self.path]
                    answer = script.popleft() if script else receiver.path_default.get(self.path,
                                                                                       receiver.default_answer)
                    received = Received(self.path, headers, body, time.monotonic(), answer.status)
                    receiver.received.append(received)
                    receiver.in_flight[msg_id] += 1
                    receiver.max_in_flight[msg_id] = max(receiver.max_in_flight[msg_id], receiver.in_flight[msg_id])
                    receiver.path_in_flight[self.path] += 1
                    receiver.path_max_in_flight[self.path] = max(receiver.path_max_in_flight[self.path],
                                                                 receiver.path_in_flight[self.path])
                    receiver._changed.notify_all()
                if receiver.on_request is not None:
                    receiver.on_request(received)
                try:
                    if answer.delay:
                        receiver.closing.wait(answer.delay)
                finally:
                    # No longer in flight once the answer is decided: the sender may start its next
                    # request the moment it reads this one, before this thread would get to count down.
                    with receiver._changed:
                        receiver.in_flight[msg_id] -= 1
                        receiver.path_in_flight[self.path] -= 1
                head = [f"HTTP/1.1 {answer.status} {HTTPStatus(answer.status).phrase}",
                        f"Content-Length: {len(answer.body)}"]
                head += [f"{name}: {value}" for name, value in answer.headers]
                self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + answer.body)

        self._server = LocalServer(Handler, backlog=1024)  # a worker opens hundreds of connections at once
        self.port = self._server.port

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *answers: Answer | int) -> None:
        with self._lock:
            self._script[path].extend(a if isinstance(a, Answer) else Answer(status=a) for a in answers)

    def requests_to(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def wait_for(self, count: int, path: str | None = None, timeout: float = 20.0) -> list[Received]:
        """Block until `count` requests arrived (to `path`, if given); fail the test after `timeout`."""
        return wait_for_count(self._changed, lambda: [r for r in self.received if path is None or r.path == path],
                              count, timeout, f"requests to {path or 'any path'}")

    def close(self):
        self.closing.set()
        self._server.close()
