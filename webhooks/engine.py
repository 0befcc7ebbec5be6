"""The delivery engine of a threaded worker: one thread sends every attempt of the process at once.

Celery's threads hand their delivery ids to the engine and go back for the next message; a thread
waits only while the engine already holds WEBHOOK_WORKER_CONCURRENCY deliveries, so no worker has
more attempts in flight than that. The engine thread:

- claims what arrived since its last turn in one call (`deliveries_claim`);
- sends the claimed attempts together on libcurl's multi interface, each with its own whole-attempt
  deadline, connect-time address check and 4 KiB excerpt (`transport.Attempt`), over connections
  it keeps alive per host;
- records the attempts that finished in one call (`deliveries_record`), which also gives freed
  slots to parked deliveries: the engine claims those itself on its next turn, without a round trip
  through the broker (if the worker dies first, beat's dispatcher finds them unclaimed and
  publishes them);
- prepares, on a small pool of threads, the attempts that must wait for something before they can be
  sent (an OAuth2 token to fetch, a host to resolve and check for WEBHOOK_PROXY_URL: webhooks/access.py),
  within the attempt's deadline, and sends them once ready;
- wakes a throttled endpoint when its next attempt may start (the claim says when), so that its
  parked deliveries go out at its rate, one after the other, without waiting for beat.

A hundred threads each sending and each talking to PostgreSQL twice spent their time handing the GIL
around; the README has the measured comparison. A failure inside the engine costs only the batch in
hand: it is logged, the leases of its claimed deliveries run out and beat sends them again. A worker
shutting down waits for the attempts in flight (their deadline bounds the wait).
"""
from __future__ import annotations

import heapq
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pycurl
from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone

from webhooks import access, transport
from webhooks.services import delivery as delivery_service

logger = logging.getLogger("herald.engine")


class Engine:
    """Claims, sends and records the attempts of every thread of this process (see the module doc)."""

    def __init__(self, *, concurrency: int) -> None:
        self.concurrency = concurrency
        self._multi = pycurl.CurlMulti()
        self._idle: list[pycurl.Curl] = []  # reused handles; the multi keeps the connections alive
        self._running: dict[int, tuple[pycurl.Curl, transport.Attempt, delivery_service.Claim, datetime,
                                       access.Prepared]] = {}
        # attempts that need a token fetched or a proxied host resolved are prepared on these threads
        self._preparing = ThreadPoolExecutor(max_workers=16, thread_name_prefix="herald-prepare")
        self._prepared: deque[tuple[delivery_service.Claim, access.Prepared, datetime]] = deque()
        self._submitted: deque[str] = deque()
        self._wakes: list[tuple[float, str]] = []  # heap of (time.monotonic(), endpoint id)
        self._wake_for: dict[str, float] = {}  # the one wake-up each endpoint has coming
        self._held = 0  # deliveries submitted and not finished yet
        self._changed = threading.Condition()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="herald-engine", daemon=True)
        self._thread.start()

    # -- called from Celery's threads

    def submit(self, delivery_id: str) -> None:
        """Hand one delivery over (its attempt, if it may go now, is sent and recorded soon after).

        Blocks only while the engine holds `concurrency` deliveries already.
        """
        with self._changed:
            while self._held >= self.concurrency:
                self._changed.wait()
            self._held += 1
            self._submitted.append(delivery_id)
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass  # a wake-up is already pending

    def drain(self, timeout: float) -> bool:
        """Wait until every delivery handed over is finished (a worker shutting down); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._held == 0, timeout)

    def _take(self, delivery_ids: list[str]) -> None:
        """Deliveries handed on by a record: claimed on the next turn (they fill only freed slots)."""
        with self._changed:
            self._held += len(delivery_ids)
            self._submitted.extend(delivery_ids)

    def _release(self, count: int) -> None:
        with self._changed:
            self._held -= count
            self._changed.notify_all()

    # -- the engine thread

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - the engine must outlive any one batch
                logger.exception("engine.turn_failed")

    def _turn(self) -> None:
        with self._changed:
            batch = list(self._submitted)
            self._submitted.clear()
        if batch:
            self._start(batch)
        if self._prepared:
            self._launch_prepared()
        self._wake_due_endpoints()
        while self._multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        finished = []
        while True:
            queued, ok, failed = self._multi.info_read()
            finished += [(curl, 0, "") for curl in ok] + failed
            if not queued:
                break
        if finished:
            self._finish(finished)
        connections.close_all()  # a connection this turn used goes back to the pool (or is closed: no pool)
        self._wait()

    def _wait(self) -> None:
        timeout_ms = self._multi.timeout()
        timeout = 1.0 if timeout_ms < 0 else min(timeout_ms / 1000, 1.0)
        if self._wakes:
            timeout = max(0.0, min(timeout, self._wakes[0][0] - time.monotonic()))
        with self._changed:
            if self._submitted or self._prepared:  # handed on by this very thread, or prepared: at once
                timeout = 0.0
        read, write, error = self._multi.fdset()
        ready, _, _ = select.select(read + [self._wake_r], write, error, timeout)
        if self._wake_r in ready:
            try:
                while self._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass

    def _wake_due_endpoints(self) -> None:
        now = time.monotonic()
        while self._wakes and self._wakes[0][0] <= now:
            when, endpoint_id = heapq.heappop(self._wakes)
            if self._wake_for.get(endpoint_id) != when:
                continue  # superseded by an earlier one
            del self._wake_for[endpoint_id]
            try:
                self._take(delivery_service.endpoint_wake(endpoint_id=endpoint_id))
            except Exception:  # noqa: BLE001 - beat's parked check hands them on instead
                logger.exception("engine.wake_failed", extra={"endpoint_id": endpoint_id})

    def _start(self, batch: list[str]) -> None:
        try:
            close_old_connections()
            result = delivery_service.deliveries_claim(delivery_ids=batch)
        except Exception:  # noqa: BLE001 - nothing was claimed, or the leases run out: beat sends them again
            logger.exception("engine.claim_failed", extra={"deliveries": len(batch)})
            self._release(len(batch))
            return
        claims = result.claims
        self._release(len(batch) - len(claims))  # duplicates, parked, not due: nothing to send
        if result.wake_at:
            now, monotonic = timezone.now(), time.monotonic()
            for endpoint_id, when in result.wake_at.items():
                at = monotonic + (when - now).total_seconds()
                if at < self._wake_for.get(endpoint_id, float("inf")):
                    self._wake_for[endpoint_id] = at
                    heapq.heappush(self._wakes, (at, endpoint_id))
        unsendable: list[delivery_service.Outcome] = []
        deadline = time.monotonic() + settings.WEBHOOK_TIMEOUT_SECONDS
        for claim in claims.values():
            if access.needs_thread(claim.access):
                # A token to fetch or a proxied host to resolve: on a thread of the pool, within the
                # attempt's deadline; the engine sends it when it is ready (`_launch_prepared`).
                self._preparing.submit(self._prepare_off_thread, claim, deadline, timezone.now())
                continue
            self._launch(claim, delivery_service.attempt_prepare(claim), timezone.now(), unsendable)
        if unsendable:
            self._record(unsendable)

    def _prepare_off_thread(self, claim: delivery_service.Claim, deadline: float, started_at: datetime) -> None:
        try:
            prepared = delivery_service.attempt_prepare(claim, timeout=max(0.001, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - a failed attempt, recorded
            logger.exception("engine.prepare_failed", extra={"delivery_id": claim.delivery_id})
            prepared = access.Prepared({}, 0, error=f"internal_error: {type(exc).__name__}")
        with self._changed:
            self._prepared.append((claim, prepared, started_at))
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass

    def _launch_prepared(self) -> None:
        with self._changed:
            ready = list(self._prepared)
            self._prepared.clear()
        unsendable: list[delivery_service.Outcome] = []
        for claim, prepared, started_at in ready:
            self._launch(claim, prepared, started_at, unsendable)
        if unsendable:
            self._record(unsendable)

    def _launch(self, claim: delivery_service.Claim, prepared: access.Prepared, started_at: datetime,
                unsendable: list[delivery_service.Outcome]) -> None:
        if prepared.error:  # no token, or the proxied host refused: a failed attempt, recorded
            unsendable.append(delivery_service.Outcome(claim, started_at,
                                                       delivery_service.attempt_failed_early(prepared)))
            return
        curl = self._idle.pop() if self._idle else pycurl.Curl()
        try:
            attempt = delivery_service.attempt_open(curl, claim, prepared)
        except Exception as exc:  # noqa: BLE001 - libcurl refused an option: a failed attempt, recorded
            curl.reset()
            self._idle.append(curl)
            unsendable.append(delivery_service.Outcome(claim, timezone.now(), transport.AttemptResult(
                status=None, body="", duration_ms=0, error=f"invalid_url: {exc}"[:200], retry_after=None)))
            return
        self._running[id(curl)] = (curl, attempt, claim, started_at, prepared)
        self._multi.add_handle(curl)

    def _finish(self, finished: list[tuple[pycurl.Curl, int, str]]) -> None:
        outcomes = []
        for curl, code, message in finished:
            _, attempt, claim, started_at, prepared = self._running.pop(id(curl))
            self._multi.remove_handle(curl)
            result = attempt.finish(code, message)
            access.after_attempt(claim.access, prepared, result)
            outcomes.append(delivery_service.Outcome(claim, started_at, result))
            curl.reset()
            self._idle.append(curl)
        self._record(outcomes)

    def _record(self, outcomes: list[delivery_service.Outcome]) -> None:
        try:
            delivery_service.deliveries_record(outcomes=outcomes, hand_on=self._take)
        except Exception:  # noqa: BLE001 - unrecorded: the leases run out and beat sends them again
            logger.exception("engine.record_failed", extra={"deliveries": len(outcomes)})
        finally:
            self._release(len(outcomes))


_engine: Engine | None = None
_engine_pid: int | None = None
_engine_lock = threading.Lock()


def start(*, concurrency: int) -> Engine:
    """This process's engine, started on first use (a threaded worker starts it when it boots)."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            _engine, _engine_pid = Engine(concurrency=concurrency), os.getpid()
        return _engine


def running() -> Engine | None:
    """The engine of this process, if it runs one (a threaded worker); None in prefork children and tests."""
    return _engine if _engine_pid == os.getpid() else None
