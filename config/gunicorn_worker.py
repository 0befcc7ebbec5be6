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
A whole request then waits for a thread in its credential's turn (see "fair turns" below), not behind
every request of a credential that sent thousands.
`Expect: 100-continue` is answered here, since the body is read here. See docs/http-reader.md.

TLS and HTTP/2 connections (neither is used by Herald; a proxy terminates TLS) take gthread's path
unchanged.
"""
from __future__ import annotations

import heapq
import io
from collections import deque
import json
import selectors
import socket
import threading
import time
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

LISTENER_DOWN_RECHECK_SECONDS = 1.0
LISTENER_RETRY_SECONDS = 2.0
from config.http_reader import Refusal, RequestReader

RECV_BYTES = 65536
# A refused connection's lingering close (as nginx's `lingering_close`): what the client still sends is
# taken and dropped for up to this long and this many bytes, then the connection is closed.
LINGER_SECONDS = 2.0
LINGER_BYTES = 2 * 1024 * 1024
REFUSALS = {
    # status: (reason phrase, problem code)
    400: ("Bad Request", "malformed_request"),
    408: ("Request Timeout", "request_timeout"),
    413: ("Content Too Large", "payload_too_large"),
    414: ("URI Too Long", "uri_too_long"),
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


def _turn(authorization: bytes | None, raw: bytes) -> tuple:
    """The queue of a whole request (see "fair turns"), from its Authorization header and its request target."""
    from intake.credentials import credential_turn   # the app is loaded before any request is read

    line = raw[:raw.find(b"\r\n")].split(b" ")
    return credential_turn(authorization, line[1] if len(line) > 1 else b"")


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
        from webhooks.conf import herald_settings

        self.client_timeout = herald_settings.web.WEB_CLIENT_TIMEOUT_SECONDS
        self.max_head = herald_settings.web.WEB_MAX_HEADER_BYTES
        self.max_body = herald_settings.api.INTAKE_MAX_BODY_BYTES
        self.pending: dict = {}   # conn -> Pending, in deadline order (one timeout for all)
        self.lingering: dict = {}  # conn -> [deadline, bytes still taken], refused, in deadline order
        self.buffering = not self.cfg.is_ssl and "h2" not in self.cfg.http_protocols
        self.running = 0          # requests given to a thread and not finished
        self.turns: dict = {}     # credential_turn() -> deque of whole requests waiting for a thread
        super().init_process()

    def enqueue_req(self, conn):
        if not self.buffering:
            return super().enqueue_req(conn)
        pending = Pending(conn, RequestReader(self.max_head, self.max_body, max_line=self.cfg.limit_request_line), time.monotonic() + self.client_timeout)
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
        raw = bytes(pending.buf)
        # A GET is kept, to be run again after a long-poll's wait (intake/longpoll.py); nothing else can
        # wait, and a kept-alive connection must not hold on to a large body it no longer needs.
        conn.herald_raw = raw if raw.startswith(b"GET ") and len(raw) <= self.max_head else None
        conn.herald_deadline = None
        conn.herald_wait = None
        conn.herald_turn = _turn(reader.authorization, raw)
        conn.parser.unreader.unread(raw)
        conn.data_ready = True
        self._dispatch(conn)
        return True

    # --- fair turns ------------------------------------------------------------------------------------
    # Whole requests wait for one of the worker's threads in one queue per credential (and tenant a platform
    # credential acts for), served in turn, rather than in gthread's single first-come queue: one credential
    # sending thousands of requests at once (long-polls over their cap, say) makes another's request wait for
    # at most one request of each busy credential, not for all of them. The queue is the credential's as this
    # process resolved it before (intake.credentials.credential_turn), never the header's spelling: requests
    # that name no credential, or one not seen yet, share one queue, so made-up headers earn no turns.

    def _dispatch(self, conn) -> None:
        if self.running < self.cfg.threads:
            self._submit(conn)
            return
        queue = self.turns.get(conn.herald_turn)
        if queue is None:
            queue = self.turns[conn.herald_turn] = deque()
        queue.append(conn)

    def _submit(self, conn) -> None:
        self.running += 1
        conn.herald_running = True
        ThreadWorker.enqueue_req(self, conn)

    def _next_turns(self) -> None:
        while self.turns and self.running < self.cfg.threads:
            turn, queue = next(iter(self.turns.items()))
            del self.turns[turn]
            conn = queue.popleft()
            if queue:
                self.turns[turn] = queue   # to the back of the round
            self._submit(conn)

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
        try:
            return super().handle_request(req, conn)
        except Parked as parked:   # a long-poll the view parked (below): its connection waits in the event loop
            return parked

    def _refuse(self, pending: Pending, status: int, detail: str) -> None:
        self.log.info("Refused %s from %s: %s", status, _peer(pending.conn), detail)
        _count_refusal(status)
        conn = pending.conn
        try:
            conn.sock.send(refusal_bytes(status, detail))
            conn.sock.shutdown(socket.SHUT_WR)   # the answer is all that is sent
        except OSError:
            self._drop(pending)
            return
        # Closing with unread bytes makes the kernel send a reset, which can destroy the answer before the
        # client reads it: a client (or a buffering proxy: nginx then answers 502) still sending the body
        # would miss its 413. So the connection lingers in the event loop, its bytes read and dropped,
        # until the client closes or LINGER_SECONDS or LINGER_BYTES run out.
        if self.pending.pop(conn, None) is not None:
            self.poller.unregister(conn.sock)
        self._linger(conn)

    def _linger(self, conn) -> None:
        """Read and drop what the client still sends, in the event loop, until it closes or LINGER_SECONDS or
        LINGER_BYTES run out; then close. The write side is already shut."""
        conn.sock.setblocking(False)
        self.lingering[conn] = [time.monotonic() + LINGER_SECONDS, LINGER_BYTES]
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_lingering, conn))

    def _on_lingering(self, conn, _sock) -> None:
        left = self.lingering.get(conn)
        if left is None:
            return
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        left[1] -= len(data)
        if not data or left[1] <= 0:
            self._end_lingering(conn)

    def _end_lingering(self, conn) -> None:
        if self.lingering.pop(conn, None) is None:
            return
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        self.nr_conns -= 1
        conn.close()

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
        while self.lingering:
            conn, (deadline, _) = next(iter(self.lingering.items()))
            if deadline > now:
                break
            self._end_lingering(conn)

    def murder_keepalived(self, force=False):
        super().murder_keepalived(force)
        if force:   # the worker is stopping: requests still being read will not be served
            for pending in list(self.pending.values()):
                self._drop(pending)
            for conn in list(self.lingering):
                self._end_lingering(conn)
            for waiter in list(self.waiting.values()):
                self._unpark(waiter)
                self._release_wait(waiter.conn, inline=True)
                self.nr_conns -= 1
                waiter.conn.close()
            for queue in self.turns.values():   # whole requests no thread will take now
                for conn in queue:
                    self._release_wait(conn, inline=True)
                    self.nr_conns -= 1
                    conn.close()
            self.turns.clear()

    # --- long-polls (intake/longpoll.py) -------------------------------------------------------------
    # A request the view parks leaves its thread at once; its connection waits here, in the event loop,
    # until a NOTIFY of its key arrives on the listener (a PostgreSQL connection of this worker's own that
    # LISTENs on POLL_CHANNEL, its socket watched by the same poller) or its deadline passes, and is then
    # run again from the bytes it was read from. While the listener is down, waiting requests are run
    # again every LISTENER_DOWN_RECHECK_SECONDS instead.
    #
    # Parked connections do not take the places of other connections: gunicorn stops accepting when it
    # holds `worker_connections` connections, and a parked one is not counted against that (it still is in
    # `nr_conns`, so a stopping worker answers it before it exits). How many may park is bounded by
    # POLL_MAX_WAITS_* (intake/waits.py), whose place a parked request holds until it is answered or its
    # client hangs up (released here then).

    @property
    def worker_connections(self) -> int:
        return self._worker_connections + len(getattr(self, "waiting", ()))

    @worker_connections.setter
    def worker_connections(self, value: int) -> None:
        self._worker_connections = value

    def load_wsgi(self):
        super().load_wsgi()
        self.wsgi = ParkingApp(self.wsgi)

    def run(self):
        self.waiting: dict = {}         # conn -> Waiter
        self.waiting_by_key: dict = {}  # key -> {conn, ...}
        self.wake_heap: list = []       # (wake_at, seq, conn), stale entries skipped
        self.notified_at: dict = {}     # key -> time.monotonic() of its last NOTIFY
        self.listener = None            # made at the first long-poll: a worker that never parks one has none
        self.listener_since = 0.0
        self.listener_retry_at = 0.0
        self._seq = 0
        from intake import longpoll
        longpoll.worker_started(self)   # /metrics shows what waits here
        super().run()

    def handle(self, conn):
        _current.conn = conn if self.buffering else None
        try:
            return super().handle(conn)
        finally:
            _current.conn = None


    def _keepalive_after(self, conn, keepalive):
        if isinstance(keepalive, Parked):
            return keepalive
        return super()._keepalive_after(conn, keepalive)

    def finish_request(self, conn, fs):
        if getattr(conn, "herald_running", False):
            conn.herald_running = False
            self.running -= 1
        try:
            result = None if fs.cancelled() or fs.exception() is not None else fs.result()
            if isinstance(result, Parked):
                self._park(conn, result)
                return
            if result is False and self.alive:
                # The answer said `Connection: close`. gunicorn would close gracefully here, on this event
                # loop's thread, waiting up to 2 s for the client to close its side: one client sending
                # `Connection: close` and never closing would stall every other connection of the worker.
                # The same lingering close, in the event loop, as a refusal's.
                try:
                    conn.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    self.nr_conns -= 1
                    conn.close()
                    return
                self._linger(conn)
                return
            super().finish_request(conn, fs)
        finally:
            self._next_turns()

    def _park(self, conn, parked: "Parked") -> None:
        if self.listener is None and time.monotonic() >= self.listener_retry_at:
            self._connect_listener()
        now = time.monotonic()
        # a message may have come between the view's look and now (or before the listener listened)
        missed = self.notified_at.get(parked.key, -1.0) >= parked.since or self.listener_since >= parked.since
        if not self.alive or missed:
            # stopping, or a message came between the view's look and now: run it again at once
            conn.herald_deadline = now if not self.alive else parked.deadline
            self._run_again(conn)
            return
        waiter = Waiter(conn, parked.key, parked.deadline)
        self.waiting[conn] = waiter
        _parked_gauge().inc()
        self.waiting_by_key.setdefault(parked.key, set()).add(conn)
        conn.sock.setblocking(False)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_waiter_readable, waiter))
        self._schedule(waiter, now)

    def _schedule(self, waiter: "Waiter", now: float) -> None:
        wake_at = waiter.deadline if self.listener is not None else min(waiter.deadline,
                                                                         now + LISTENER_DOWN_RECHECK_SECONDS)
        self._seq += 1
        heapq.heappush(self.wake_heap, (wake_at, self._seq, waiter.conn))

    def _unpark(self, waiter: "Waiter") -> None:
        conn = waiter.conn
        if self.waiting.pop(conn, None) is not None:
            _parked_gauge().dec()
        keyed = self.waiting_by_key.get(waiter.key)
        if keyed is not None:
            keyed.discard(conn)
            if not keyed:
                del self.waiting_by_key[waiter.key]
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _wake(self, waiter: "Waiter", deadline: float) -> None:
        self._unpark(waiter)
        waiter.conn.herald_deadline = deadline
        self._run_again(waiter.conn)

    def _run_again(self, conn) -> None:
        """The same request again, on a thread, from the bytes it was read from."""
        conn.sock.setblocking(True)
        conn.parser = None
        conn.initialized = False
        conn.init()
        conn.parser.unreader.unread(conn.herald_raw)
        conn.data_ready = True
        self._dispatch(conn)

    def _on_waiter_readable(self, waiter: "Waiter", _sock) -> None:
        """The client hung up (or sent more, which HTTP/1.1 clients do not while they wait)."""
        try:
            gone = not waiter.conn.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            gone = True
        if gone:
            self._unpark(waiter)
            self._release_wait(waiter.conn)
            self.nr_conns -= 1
            waiter.conn.close()
        else:
            self._wake(waiter, time.monotonic())   # answered now, so what it sent is read next

    def _release_wait(self, conn, inline: bool = False) -> None:
        """The long-poll's place under POLL_MAX_WAITS_* is free: its client is gone. On a thread (a Redis
        call), except when the worker stops."""
        from intake import waits

        wait, conn.herald_wait = getattr(conn, "herald_wait", None), None
        if wait is None:
            return
        if inline:
            waits.release(wait)
        else:
            self.tpool.submit(waits.release, wait)

    def wait_for_and_dispatch_events(self, timeout):
        now = time.monotonic()
        if self.wake_heap:
            timeout = max(0.0, min(timeout, self.wake_heap[0][0] - now))
        super().wait_for_and_dispatch_events(timeout)
        now = time.monotonic()
        if not self.alive:
            for waiter in list(self.waiting.values()):
                self._wake(waiter, now)   # answered (an empty page) now, with Connection: close
        while self.wake_heap and self.wake_heap[0][0] <= now:
            _, _, conn = heapq.heappop(self.wake_heap)
            waiter = self.waiting.get(conn)
            if waiter is None:
                continue   # woken already
            if waiter.deadline <= now or self.listener is None:
                self._wake(waiter, waiter.deadline)
            else:
                self._schedule(waiter, now)   # the listener is back: wait for its NOTIFY
        if self.listener is None and self.waiting and now >= self.listener_retry_at:
            self._connect_listener()
        if len(self.notified_at) > 10000:
            self.notified_at = {key: at for key, at in self.notified_at.items() if at > now - 60}

    def _connect_listener(self) -> None:
        import psycopg
        from django.db import connection

        from webhooks.delivery.publishing import POLL_CHANNEL

        try:
            params = {key: value for key, value in connection.get_connection_params().items()
                      if key not in ("cursor_factory", "context", "prepare_threshold")}
            listener = psycopg.connect(**params, autocommit=True)
            listener.execute(f"LISTEN {POLL_CHANNEL}")
        except Exception as exc:
            self.log.warning("Long-poll listener: cannot connect (%s); waiting requests look again every %s s",
                             exc, LISTENER_DOWN_RECHECK_SECONDS)
            self.listener_retry_at = time.monotonic() + LISTENER_RETRY_SECONDS
            return
        listener.pgconn.nonblocking = 1
        self.listener = listener
        self.listener_since = time.monotonic()
        self.listener_fd = listener.fileno()   # a lost connection no longer tells its socket
        self.poller.register(self.listener_fd, selectors.EVENT_READ, self._on_notify)
        for waiter in list(self.waiting.values()):   # anything may have come while it was down
            self._wake(waiter, waiter.deadline)

    def _on_notify(self, _fd) -> None:
        pgconn = self.listener.pgconn
        try:
            pgconn.consume_input()
            now = time.monotonic()
            while (notify := pgconn.notifies()) is not None:
                key = notify.extra.decode()
                self.notified_at[key] = now
                for conn in list(self.waiting_by_key.get(key, ())):
                    self._wake(self.waiting[conn], self.waiting[conn].deadline)
        except Exception as exc:
            self.log.warning("Long-poll listener lost (%s); reconnecting", exc)
            try:
                self.poller.unregister(self.listener_fd)
            except (KeyError, ValueError, OSError):
                pass
            try:
                self.listener.close()
            except Exception:
                pass
            self.listener = None
            self.listener_retry_at = time.monotonic() + LISTENER_RETRY_SECONDS
            for waiter in list(self.waiting.values()):
                self._wake(waiter, waiter.deadline)   # run again now; parked again, they look every second


class Waiter:
    __slots__ = ("conn", "key", "deadline")

    def __init__(self, conn, key: str, deadline: float):
        self.conn = conn
        self.key = key
        self.deadline = deadline


class Parked(Exception):
    """Raised out of the WSGI app (past Django, which has finished with the request) when the view parked it."""

    def __init__(self, key: str, deadline: float, since: float):
        super().__init__(key)
        self.key = key
        self.deadline = deadline
        self.since = since

    def __bool__(self) -> bool:
        return True


_current = threading.local()   # the connection a thread is serving


class ParkingApp:
    """The WSGI app, with a LongPoll in the environ of every request the worker can park."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        from intake import waits
        from intake.longpoll import ENVIRON_KEY, LongPoll

        conn = getattr(_current, "conn", None)
        if conn is None or getattr(conn, "herald_raw", None) is None:
            return self.app(environ, start_response)
        longpoll = LongPoll(deadline=conn.herald_deadline, wait=getattr(conn, "herald_wait", None))
        conn.herald_deadline = conn.herald_wait = None
        environ[ENVIRON_KEY] = longpoll

        def start(status, headers, exc_info=None):
            if longpoll.refused and hasattr(start_response, "__self__"):
                # 429 too_many_waits: the connection is closed, so that a client over its cap holds no place
                start_response.__self__.force_close()   # gunicorn's Response: `Connection: close`
            return start_response(status, headers, exc_info)

        try:
            result = self.app(environ, start)
        except BaseException:
            waits.release(longpoll.wait)
            raise
        if longpoll.parked_on is None:
            waits.release(longpoll.wait)   # answered: its place is free
            return result
        conn.herald_wait = longpoll.wait
        if hasattr(result, "close"):
            result.close()   # Django's request_finished: its database connection goes back
        raise Parked(longpoll.parked_on, longpoll.deadline, longpoll.since)


def _peer(conn) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) else str(client)


def _parked_gauge():
    from intake.metrics import polls_parked   # the app is loaded by the time anything parks

    return polls_parked


def _count_refusal(status: int) -> None:
    from intake.metrics import http_refusals   # the app is loaded by the time anything is refused

    http_refusals.labels(str(status)).inc()
