"""Local webhook receivers: threaded HTTP servers that verify every signature and record what they answered."""
from __future__ import annotations

import http.server
import random
import select
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http import HTTPStatus

from standardwebhooks import Webhook

HANG_EXTRA_SECONDS = 3.0  # a hang lasts the sender's timeout plus this, unless the sender gives up first


@dataclass(frozen=True)
class Plan:
    """What the receiver means to do with one request."""

    kind: str  # ok | slow | 500 | 503 | hang | 410
    status: int = 200
    delay: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Hit:
    """One request as the receiver saw it, and the answer it actually gave."""

    webhook_id: str
    path: str
    body: bytes
    headers: dict[str, str]
    arrived: float  # time.monotonic()
    wall: float  # time.time()
    plan: Plan
    verified: bool
    verify_error: str = ""
    peer_port: int = 0
    peer_host: str = ""
    answered: int | None = None  # status written to a still-connected sender; None if the sender gave up first
    finished: float | None = None
    client_gone: bool = False
    write_error: str = ""


# ---------------------------------------------------------------- behaviours

class Behaviour:
    """Chooses a Plan per request from a seeded RNG (arrival order is the only nondeterminism)."""

    name = "behaviour"

    def plan(self, rng: random.Random) -> Plan:  # pragma: no cover - interface
        raise NotImplementedError


class AlwaysOk(Behaviour):
    name = "always 200"

    def plan(self, rng):
        return Plan("ok", 200)


class Slow(Behaviour):
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.name = f"slow 200 ({seconds:g}s)"

    def plan(self, rng):
        return Plan("slow", 200, delay=self.seconds)


class Hang(Behaviour):
    """Never answers in time: holds every request past the sender's timeout (until it hangs up)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.name = f"hang past the {timeout:g}s timeout"

    def plan(self, rng):
        return Plan("hang", 200, delay=self.timeout + HANG_EXTRA_SECONDS)


class Switch(Behaviour):
    """Answers 500 while `failing` is set, then 200: a receiver that is down, then comes back."""

    def __init__(self):
        self.failing = threading.Event()
        self.failing.set()
        self.name = "500 until switched, then 200"

    def plan(self, rng):
        return Plan("500", 500) if self.failing.is_set() else Plan("ok", 200)


class Gone(Behaviour):
    name = "410 Gone"

    def plan(self, rng):
        return Plan("410", 410)


class Flapping(Behaviour):
    """Random 200 / 500 / 503 with Retry-After: 1 / hang past the timeout / slow 200."""

    def __init__(self, *, timeout: float, ok: float = 0.35, e500: float = 0.2, e503: float = 0.15, hang: float = 0.1,
                 slow: float = 0.2, slow_seconds: tuple[float, float] = (0.2, 0.6), label: str = "flapping"):
        self.timeout = timeout
        self.weights = {"ok": ok, "500": e500, "503": e503, "hang": hang, "slow": slow}
        self.slow_seconds = slow_seconds
        self.name = label + " " + "/".join(f"{k}:{v:g}" for k, v in self.weights.items() if v)

    def plan(self, rng):
        kinds, weights = zip(*self.weights.items())
        kind = rng.choices(kinds, weights)[0]
        if kind == "ok":
            return Plan("ok", 200)
        if kind == "500":
            return Plan("500", 500)
        if kind == "503":
            return Plan("503", 503, headers=(("Retry-After", "1"),))
        if kind == "hang":
            return Plan("hang", 200, delay=self.timeout + HANG_EXTRA_SECONDS)
        return Plan("slow", 200, delay=round(rng.uniform(*self.slow_seconds), 3))


# ---------------------------------------------------------------- verification

def verify(secret: str | None, body: bytes, headers: dict[str, str]) -> tuple[bool, str]:
    """Standard Webhooks verification with the `standardwebhooks` package; (ok, error)."""
    if not secret:
        return False, "no secret configured"
    try:
        Webhook(secret).verify(body, {k: headers.get(k, "") for k in
                                      ("webhook-id", "webhook-timestamp", "webhook-signature")}, json_parse=False)
        return True, ""
    except Exception as exc:  # noqa: BLE001 - any failure is "unverified"
        return False, f"{type(exc).__name__}: {exc}"


def _client_went_away(conn: socket.socket, seconds: float, closing: threading.Event) -> bool:
    """Wait up to `seconds`; True as soon as the sender closes or shuts down its side (EOF)."""
    deadline = time.monotonic() + seconds
    while not closing.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            readable, _, _ = select.select([conn], [], [], min(remaining, 0.25))
        except (OSError, ValueError):
            return True
        if readable:
            try:
                data = conn.recv(1, socket.MSG_PEEK)
            except OSError:
                return True
            if not data:
                return True
            time.sleep(min(remaining, 0.05))  # a pipelined request (not expected): just wait on
    return False


# ---------------------------------------------------------------- the server

class Receiver:
    """A threaded HTTP/1.1 server on 127.0.0.1 (or `host`: an address of a test host of the `hosts` scenario)
    that answers by its behaviour and records every request."""

    def __init__(self, name: str, behaviour: Behaviour, seed: int = 0, host: str = "127.0.0.1"):
        self.name = name
        self.behaviour = behaviour
        self.secret: str | None = None  # the signing secret of the endpoint at `url`
        self.secrets: dict[str, str] = {}  # per path, when several endpoints point at this receiver
        self.hits: list[Hit] = []
        self.in_flight: dict[tuple[str, str], int] = defaultdict(int)  # by (path, webhook-id)
        self.max_in_flight: dict[tuple[str, str], int] = defaultdict(int)
        self.errors = 0
        self.closing = threading.Event()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                receiver._handle(self)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            request_queue_size = 256

            def handle_error(self, request, client_address):
                receiver.errors += 1  # a sender that gave up on a hang is expected here

        self.host = host
        self._server = Server((host, 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}/hook/{name}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"receiver-{name}", daemon=True)
        self._thread.start()

    # -- request handling

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in handler.headers.items()}
        msg_id = headers.get("webhook-id", "")
        verified, verify_error = verify(self.secrets.get(handler.path, self.secret), body, headers)
        with self._changed:
            plan = self.behaviour.plan(self._rng)
            hit = Hit(webhook_id=msg_id, path=handler.path, body=body, headers=headers, arrived=time.monotonic(),
                      wall=time.time(), plan=plan, verified=verified, verify_error=verify_error,
                      peer_port=handler.client_address[1], peer_host=handler.client_address[0])
            self.hits.append(hit)
            flight = (handler.path, msg_id)  # one endpoint's copy of the webhook
            self.in_flight[flight] += 1
            self.max_in_flight[flight] = max(self.max_in_flight[flight], self.in_flight[flight])
            self._changed.notify_all()
        try:
            if plan.delay and _client_went_away(handler.connection, plan.delay, self.closing):
                hit.client_gone = True
                handler.close_connection = True
                return
            payload = f"{plan.kind} from {self.name}".encode()
            head = [f"HTTP/1.1 {plan.status} {HTTPStatus(plan.status).phrase}",
                    "Content-Type: text/plain", f"Content-Length: {len(payload)}"]
            head += [f"{name}: {value}" for name, value in plan.headers]
            hit.answered = plan.status  # set first: the sender may read the answer before this thread runs on
            try:  # headers and body in one write
                handler.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
                handler.wfile.flush()
            except OSError as exc:
                hit.answered = None
                hit.write_error = repr(exc)
                hit.client_gone = True
                handler.close_connection = True
        finally:
            with self._changed:
                hit.finished = time.monotonic()
                self.in_flight[flight] -= 1
                self._changed.notify_all()

    # -- reading what happened

    def snapshot(self) -> list[Hit]:
        with self._lock:
            return list(self.hits)

    def by_id(self) -> dict[str, list[Hit]]:
        out: dict[str, list[Hit]] = defaultdict(list)
        for hit in self.snapshot():
            out[hit.webhook_id].append(hit)
        for hits in out.values():
            hits.sort(key=lambda h: h.arrived)
        return dict(out)

    def succeeded_ids(self, path: str | None = None) -> set[str]:
        """Webhook ids answered 2xx at least once (to a sender still connected) with a verified signature."""
        return {h.webhook_id for h in self.snapshot() if h.verified and h.answered is not None
                and 200 <= h.answered < 300 and (path is None or h.path == path)}

    def path_url(self, suffix: str) -> tuple[str, str]:
        """(path, url) of one more endpoint on this receiver."""
        path = f"/hook/{self.name}/{suffix}"
        return path, f"http://{self.host}:{self.port}{path}"

    def unverified(self) -> list[Hit]:
        return [h for h in self.snapshot() if not h.verified]

    def concurrent_ids(self) -> dict[tuple[str, str], int]:
        """(path, webhook id) ever being received more than once at the same moment: one delivery sent twice."""
        with self._lock:
            return {k: v for k, v in self.max_in_flight.items() if v > 1}

    def intervals(self, path: str | None = None) -> list[tuple[float, float]]:
        """(arrived, finished) of every request (to `path`, if given); one still open ends at infinity."""
        return [(hit.arrived, hit.finished if hit.finished is not None else float("inf"))
                for hit in self.snapshot() if path is None or hit.path == path]

    def inflight(self) -> list[tuple[int, str]]:
        """(sender's local port, webhook id) of the requests being answered right now."""
        with self._lock:
            return [(h.peer_port, h.webhook_id) for h in self.hits if h.finished is None]

    def wait_for_ids(self, ids: set[str], timeout: float) -> set[str]:
        """Wait until every id was answered 2xx with a verified signature; return the ids still missing."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                done = {h.webhook_id for h in self.hits if h.verified and h.answered is not None
                        and 200 <= h.answered < 300}
                missing = set(ids) - done
                if not missing:
                    return missing
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return missing
                self._changed.wait(min(remaining, 1.0))

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Receivers:
    """Every receiver of a run, closed together."""

    items: list[Receiver] = field(default_factory=list)

    def new(self, name: str, behaviour: Behaviour, seed: int = 0, host: str = "127.0.0.1") -> Receiver:
        receiver = Receiver(name, behaviour, seed, host)
        self.items.append(receiver)
        return receiver

    def close(self) -> None:
        for receiver in self.items:
            try:
                receiver.close()
            except Exception:  # noqa: BLE001
                pass
        self.items.clear()
