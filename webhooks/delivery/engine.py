"""The delivery engine of a threaded worker: one thread sends every attempt of the process at once.

Celery's threads hand their delivery ids to the engine and go back for the next message; a thread
waits only while the engine already holds WEBHOOK_WORKER_CONCURRENCY deliveries, so no worker has
more attempts in flight than that. A claimer thread claims what arrived since its last call in one call
(`claim.deliveries_claim`) on a PostgreSQL connection of its own, and hands the claims to the engine thread,
which never waits on a claim: when it claimed itself, draining 90 slow receivers it spent 59 % of its time
claiming, while the deliveries the records had handed freed slots to waited for it to send them
(docs/benchmarks.md, slow receivers). The engine thread:

- sends the claimed attempts together on libcurl's multi interface, each with its own whole-attempt
  deadline, connect-time address check and 4 KiB excerpt (`transport.Attempt`), over connections
  it keeps alive per host;
- hands the attempts that finished to its recorder thread, which records whatever has finished since its
  last call in one call (`record.deliveries_record`) on a PostgreSQL connection of its own, while the
  engine goes on sending (two recorder threads, each with its share of the endpoints, used more CPU per
  delivery for no more deliveries: docs/benchmarks.md, slow receivers). The record also gives freed slots
  to parked deliveries and claims them in its own transaction, before its endpoints' locks go, so that no
  claim of a fresh delivery takes such a slot first and parks the handed-on one again; the engine sends them on its next turn, without a
  round trip through the broker (if the worker dies first, their leases run out and beat's dispatcher
  publishes them). One thread doing both waited on PostgreSQL for two thirds of its time, its records
  holding up the claims (docs/benchmarks.md, slow receivers);
- prepares, on a small pool of threads, the attempts that must wait for something before they can be
  sent (an OAuth2 token to fetch, a host to resolve and check for WEBHOOK_PROXY_URL: webhooks/delivery/destinations/access.py),
  and sends them once ready. Each preparation has the attempt's whole deadline, counted from when its
  own preparation starts. One tenant has at most PREPARE_PER_TENANT of the PREPARE_THREADS threads: its
  attempts past that wait their turn (deferred, not failed), so a tenant whose token server hangs
  slows only its own attempts. A deferred attempt whose lease would run out before it could finish is
  given up without an attempt: its lease runs out and beat's dispatcher sends it again. At most
  DEFERRED_PER_TENANT of a tenant's attempts wait so; one claimed past that is handed back at once
  (`outbox.hand_back`: its lease released, due again HAND_BACK_SECONDS later, published fairly), so that one
  tenant's claims cannot fill the engine's slots and memory (each holds its payload) while they wait;
- sends the attempts to message brokers (SPEC §14) in batches, one per endpoint and turn, on the broker
  threads (webhooks/delivery/destinations/brokers.py: a tenant's at most BROKER_PER_TENANT of them at once,
  each batch within the attempts' deadline, over a bounded pool of connections per endpoint), and records
  them when they come back; the engine thread never waits on a broker;
- wakes a throttled endpoint when its next attempt may start (the claim says when), so that its
  parked deliveries go out at its rate, one after the other, without waiting for beat; and starts a throttled
  endpoint's attempts its interval apart at least, however long each waited between its claim and its start
  (webhooks/delivery/pacing.py).

A hundred threads each sending and each talking to PostgreSQL twice spent their time handing the GIL
around; the README has the measured comparison. A failure inside the engine costs only the batch in
hand: it is logged, the leases of its claimed deliveries run out and beat sends them again. A worker
shutting down waits for the attempts in flight (their deadline bounds the wait).
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pycurl
from django.db import close_old_connections, connections
from django.utils import timezone

from webhooks import tracing
from webhooks.conf import herald_settings
from webhooks.delivery import outbox, parked, record, sending
from webhooks.delivery.attempts import Outcome
from webhooks.delivery.claim import Claim, Claims, deliveries_claim, delivery_claim
from webhooks.delivery.destinations import access, brokers, http_transport
from webhooks.delivery.destinations.kinds import BROKERS
from webhooks.delivery.destinations.base import AttemptResult
from webhooks.delivery.pacing import Pacing, WakeUps

logger = logging.getLogger("herald.engine")

# The threads that prepare attempts (a token fetch, a proxied host's lookup), and how many of them one
# tenant's attempts may hold at once: at least four tenants whose token servers all hang to fill them.
PREPARE_THREADS = 16
PREPARE_PER_TENANT = 4
# How many more of a tenant's claimed attempts may wait for its share of those threads: four rounds of its share
# (about what the threads get through within a lease when its token server hangs, and a moment's work when it
# answers). A claim past that is handed back, due again this much later, so that it comes back through the
# relay's fair choice rather than holding a slot of the engine meanwhile.
DEFERRED_PER_TENANT = 4 * PREPARE_PER_TENANT
HAND_BACK_SECONDS = 2.0


class Engine:
    """Claims, sends and records the attempts of every thread of this process (see the module doc)."""

    def __init__(self, *, concurrency: int) -> None:
        self.concurrency = concurrency
        self._multi = pycurl.CurlMulti()
        # libcurl tells us which sockets to watch (and when to call it back) instead of handing over every
        # socket each turn: select() stops at descriptor 1024, and a thousand attempts in flight need more.
        self._selector = selectors.DefaultSelector()
        self._watched: dict[int, int] = {}  # socket -> the selectors events watched on it
        self._ready: dict[int, int] = {}  # socket -> libcurl's CSELECT bits, ready since the last turn
        self._timeout_at: float | None = None  # when libcurl wants to be called back (time.monotonic())
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._idle: list[pycurl.Curl] = []  # reused handles; the multi keeps the connections alive
        self._running: dict[int, tuple[pycurl.Curl, http_transport.Attempt, Claim, datetime,
                                       access.Prepared, tracing.DeliveryTrace | None]] = {}
        self._origins: dict[str, object] = {}  # tracing on: delivery id -> the Celery task span that brought it
        # attempts that need a token fetched or a proxied host resolved are prepared on these threads
        self._preparing = ThreadPoolExecutor(max_workers=PREPARE_THREADS, thread_name_prefix="herald-prepare")
        self._preparing_of: dict[str, int] = {}  # tenant id -> its preparations on the pool (under _changed)
        self._deferred: dict[str, deque[tuple[Claim, tracing.DeliveryTrace | None]]] = {}  # over its share
        self._prepared: deque[tuple[Claim, access.Prepared, datetime,
                                    tracing.DeliveryTrace | None]] = deque()
        self._submitted: deque[str] = deque()  # for the claimer thread
        self._brokers = brokers.Sender(self._broker_done,
                                       timeout=lambda: herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS,
                                       allow_private=lambda: herald_settings.delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS)
        self._sent: deque[tuple[Outcome, tracing.DeliveryTrace | None]] = deque()  # broker attempts back
        # claimed, to be sent: by the claimer thread (with their traces), and by the recorder's records (the
        # parked deliveries their freed slots went to: traces made when the engine takes them)
        self._claimed: deque[tuple[Claims, dict[str, tracing.DeliveryTrace] | None]] = deque()
        self._wakes = WakeUps()
        self._paced = Pacing()
        self._held = 0  # deliveries submitted and not finished yet
        lock = threading.RLock()
        self._changed = threading.Condition(lock)
        self._claimable = threading.Condition(lock)  # the claimer thread waits on it for submitted ids
        self._claimer_stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        # finished attempts waiting for the recorder thread, which records them in one call
        self._recordable = threading.Condition()
        self._to_record: list[tuple[Outcome, tracing.DeliveryTrace | None]] = []
        self._recorder_stopping = False
        self._recorder = threading.Thread(target=self._record_loop, name="herald-recorder", daemon=True)
        self._recorder.start()
        self._claimer = threading.Thread(target=self._claim_loop, name="herald-claimer", daemon=True)
        self._claimer.start()
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
            if tracing.ENABLED:
                self._origins[delivery_id] = tracing.current_span_context()
            self._claimable.notify()

    def drain(self, timeout: float) -> bool:
        """Wait until every delivery handed over is finished (a worker shutting down); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._held == 0, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """End the engine thread after its current turn, and the preparing threads (an engine of a test, after
        `drain`: no scheduled wake-up of a throttled endpoint may query the database after its test)."""
        with self._claimable:
            self._claimer_stopping = True
            self._claimable.notify()
        self._claimer.join(timeout)
        if self._claimer.is_alive():
            logger.warning("engine.stop_timed_out", extra={"thread": "claimer", "seconds": timeout})
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("engine.stop_timed_out", extra={"thread": "engine", "seconds": timeout})
        with self._recordable:  # what the engine's last turn finished is recorded before the recorder ends
            self._recorder_stopping = True
            self._recordable.notify()
        self._recorder.join(timeout)
        if self._recorder.is_alive():
            logger.warning("engine.stop_timed_out", extra={"thread": "recorder", "seconds": timeout})
        self._preparing.shutdown(wait=True, cancel_futures=True)
        self._brokers.stop()

    def _take(self, delivery_ids: list[str]) -> None:
        """Deliveries handed on by a throttled endpoint's wake-up: claimed on the engine's next turn (they fill
        only freed slots)."""
        with self._changed:
            self._held += len(delivery_ids)
            self._submitted.extend(delivery_ids)
            self._claimable.notify()

    def _take_claimed(self, claims: Claims) -> None:
        """On the recorder thread: the deliveries a record handed its freed slots to, claimed in its transaction,
        which the engine sends on its next turn."""
        with self._changed:
            self._held += len(claims.claims)
            self._claimed.append((claims, None))
        self._wake()

    def _start_claimed(self) -> None:
        with self._changed:
            claimed = list(self._claimed)
            self._claimed.clear()
        for result, traces in claimed:
            if traces is None:
                traces = {}
                if tracing.ENABLED and result.claims:
                    try:  # claimed in a record's transaction: the claim span marks when the engine took them
                        with tracing.batch("herald.claim.batch", len(result.claims)) as claim_batch:
                            traces = tracing.delivery_traces(result.claims, claim_batch, {})
                    except Exception:  # noqa: BLE001 - sent untraced rather than not at all
                        logger.exception("engine.trace_failed", extra={"deliveries": len(result.claims)})
            self._dispatch(result, traces)

    def _wake(self) -> None:
        """Wake the engine thread from its wait (a wake-up already pending is enough)."""
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass

    def _release(self, count: int) -> None:
        with self._changed:
            self._held -= count
            self._changed.notify_all()

    # -- the engine thread

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - the engine must outlive any one batch
                logger.exception("engine.turn_failed")

    def _turn(self) -> None:
        if self._claimed:
            self._start_claimed()
        if self._paced.waiting:
            self._launch_paced()
        if self._prepared:
            self._launch_prepared()
        if self._sent:
            self._record_sent()
        self._wake_due_endpoints()
        self._drive()
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

    # libcurl's multi_socket interface: it names the sockets and the timeout it needs; we wait on them
    # with the platform's selector (epoll here) and tell it which are ready.

    def _on_socket(self, what: int, sock: int, multi, socketp) -> None:
        events = {pycurl.POLL_IN: selectors.EVENT_READ, pycurl.POLL_OUT: selectors.EVENT_WRITE,
                  pycurl.POLL_INOUT: selectors.EVENT_READ | selectors.EVENT_WRITE}.get(what, 0)
        watched = self._watched.get(sock)
        if not events:  # POLL_REMOVE: libcurl is done with it (it may close it next)
            if watched is not None:
                del self._watched[sock]
                try:
                    self._selector.unregister(sock)
                except (KeyError, ValueError, OSError):
                    pass
            return
        if watched is None:
            self._selector.register(sock, events)
        elif watched != events:
            self._selector.modify(sock, events)
        self._watched[sock] = events

    def _on_timer(self, timeout_ms: int) -> None:
        self._timeout_at = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000

    def _drive(self) -> None:
        """Let libcurl act on the sockets that became ready and on its timeout, if due."""
        ready, self._ready = self._ready, {}
        for sock, bits in ready.items():
            self._multi.socket_action(sock, bits)
        if self._timeout_at is not None and self._timeout_at <= time.monotonic():
            self._timeout_at = None
            self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)

    def _wait(self) -> None:
        timeout = 1.0
        if self._timeout_at is not None:
            timeout = min(timeout, max(0.0, self._timeout_at - time.monotonic()))
        for at in (self._wakes.next_at(), self._paced.next_at()):
            if at is not None:
                timeout = max(0.0, min(timeout, at - time.monotonic()))
        with self._changed:
            if self._claimed or self._prepared or self._sent:  # claimed, prepared, sent: at once
                timeout = 0.0
        for key, events in self._selector.select(timeout):
            if key.fileobj is self._wake_r:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            bits = (pycurl.CSELECT_IN if events & selectors.EVENT_READ else 0) | (
                pycurl.CSELECT_OUT if events & selectors.EVENT_WRITE else 0)
            self._ready[key.fd] = self._ready.get(key.fd, 0) | bits

    def _wake_due_endpoints(self) -> None:
        for endpoint_id in self._wakes.due(time.monotonic()):
            try:
                self._take(parked.endpoint_wake(endpoint_id=endpoint_id))
            except Exception:  # noqa: BLE001 - beat's parked check hands them on instead
                logger.exception("engine.wake_failed", extra={"endpoint_id": endpoint_id})

    def _dispatch(self, result: Claims, traces: dict[str, tracing.DeliveryTrace]) -> None:
        """Send claimed attempts on their way (libcurl, the preparing pool, the broker threads), and note when
        each throttled endpoint may start its next one."""
        items = [(claim, traces.get(claim.delivery_id)) for claim in result.claims.values()]
        if result.wake_at:
            now, monotonic = timezone.now(), time.monotonic()
            lease = timedelta(seconds=herald_settings.delivery.WEBHOOK_LEASE_SECONDS)
            for endpoint_id, when in result.wake_at.items():
                self._wakes.add(endpoint_id, when, monotonic + (when - now).total_seconds())
            # a throttled endpoint's claim (one a batch at most): not started sooner than its interval after the last
            items = [item for item in items if item[0].endpoint_id not in result.wake_at
                     or self._paced.start_now(item, result.wake_at[item[0].endpoint_id] - (item[0].lease_end - lease),
                                              monotonic)]
        self._send(items)

    def _launch_paced(self) -> None:
        self._send(self._paced.due(time.monotonic()))

    def _send(self, items: list[tuple[Claim, tracing.DeliveryTrace | None]]) -> None:
        unsendable: list[tuple[Outcome, tracing.DeliveryTrace | None]] = []
        handed_back: list[Claim] = []
        to_brokers: dict[str, list[tuple[Claim, tracing.DeliveryTrace | None]]] = {}
        for claim, trace in items:
            if claim.kind in BROKERS:
                to_brokers.setdefault(claim.endpoint_id, []).append((claim, trace))
                continue
            if access.needs_thread(claim.access):
                # A token to fetch or a proxied host to resolve: on a thread of the pool, within the tenant's
                # share of it; the engine sends it when it is ready (`_launch_prepared`).
                if not self._prepare_later(claim, trace):
                    handed_back.append(claim)
                continue
            self._launch(claim, sending.attempt_prepare(claim), timezone.now(), trace, unsendable)
        if handed_back:
            self._hand_back(handed_back)
        if unsendable:
            self._record(unsendable)
        for items in to_brokers.values():
            self._send_to_broker(items)

    def _send_to_broker(self, items: list[tuple[Claim, tracing.DeliveryTrace | None]]) -> None:
        """One endpoint's claimed broker attempts, as one batch on the broker threads (`_broker_done` takes
        their results); given up unsent, like a preparation, if its leases would run out first."""
        messages = []
        for claim, trace in items:
            headers = sending.attempt_headers(claim)
            if trace is not None:
                trace.attempt_started(headers)
            messages.append(sending.broker_message(claim, headers))
        first = items[0][0]
        lease_end = min(claim.lease_end for claim, _ in items)
        timeout = timedelta(seconds=herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS)

        context = {"items": items, "started_at": None}

        def ready() -> bool:
            context["started_at"] = timezone.now()  # the attempts' start, once their turn has come
            return lease_end - context["started_at"] >= timeout

        self._brokers.submit(brokers.Batch(first.tenant_id, BROKERS[first.kind], first.access.target, messages,
                                           context=context, ready=ready))

    def _broker_done(self, batch: brokers.Batch, results: list[AttemptResult] | None) -> None:
        """On a broker thread: a batch's results, recorded by the engine thread on its next turn."""
        items, started_at = batch.context["items"], batch.context["started_at"]
        if results is None:  # given up: its leases run out and beat's dispatcher sends them again
            self._release(len(items))
            return
        with self._changed:
            for (claim, trace), result in zip(items, results):
                if trace is not None:
                    trace.attempt_finished(result)
                self._sent.append((Outcome(claim, started_at, result), trace))
        self._wake()

    def _record_sent(self) -> None:
        with self._changed:
            sent = list(self._sent)
            self._sent.clear()
        self._record(sent)

    def _hand_back(self, claims: list[Claim]) -> None:
        """Claims past their tenant's DEFERRED_PER_TENANT: unattempted, due again HAND_BACK_SECONDS from now."""
        try:
            close_old_connections()
            outbox.hand_back(claims=[(c.delivery_id, c.lease_end) for c in claims], delay=HAND_BACK_SECONDS)
            logger.info("engine.handed_back", extra={"deliveries": len(claims),
                                                     "tenants": sorted({c.tenant_id for c in claims})})
        except Exception:  # noqa: BLE001 - their leases run out and beat's dispatcher sends them again
            logger.exception("engine.hand_back_failed", extra={"deliveries": len(claims)})
        finally:
            self._release(len(claims))

    def _prepare_later(self, claim: Claim, trace: tracing.DeliveryTrace | None) -> bool:
        """Prepare the claim's attempt on the pool now, or, while its tenant holds its share of the pool,
        once one of the tenant's preparations ends; False (not taken) if DEFERRED_PER_TENANT of the
        tenant's attempts wait already."""
        tenant = claim.tenant_id
        with self._changed:
            if self._preparing_of.get(tenant, 0) >= PREPARE_PER_TENANT:
                waiting = self._deferred.setdefault(tenant, deque())
                if len(waiting) >= DEFERRED_PER_TENANT:
                    return False
                waiting.append((claim, trace))
                return True
            self._preparing_of[tenant] = self._preparing_of.get(tenant, 0) + 1
        self._preparing.submit(self._prepare_off_thread, claim, trace)
        return True

    def _prepare_off_thread(self, claim: Claim, trace: tracing.DeliveryTrace | None) -> None:
        timeout = herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS
        while claim is not None:
            # The attempt's deadline starts with its own preparation, not when it was claimed or queued.
            started_at = timezone.now()
            if claim.lease_end - started_at < timedelta(seconds=timeout):
                # it waited so long for its turn that it could outlive its lease: given up, unrecorded (the
                # lease runs out and beat's dispatcher sends it again, with a fresh one)
                logger.warning("engine.prepare_given_up", extra={"delivery_id": claim.delivery_id,
                                                                 "tenant_id": claim.tenant_id})
                self._release(1)
            else:
                try:
                    prepared = sending.attempt_prepare(claim, timeout=timeout)
                except Exception as exc:  # noqa: BLE001 - a failed attempt, recorded
                    logger.exception("engine.prepare_failed", extra={"delivery_id": claim.delivery_id})
                    prepared = access.Prepared({}, 0, error=f"internal_error: {type(exc).__name__}")
                with self._changed:
                    self._prepared.append((claim, prepared, started_at, trace))
                self._wake()
            # this thread goes on with the tenant's next deferred attempt, if any (its place in the share)
            claim, trace = self._next_deferred(claim.tenant_id)

    def _next_deferred(self, tenant: str) -> tuple[Claim | None, tracing.DeliveryTrace | None]:
        with self._changed:
            waiting = self._deferred.get(tenant)
            if waiting:
                claim, trace = waiting.popleft()
                if not waiting:
                    del self._deferred[tenant]
                return claim, trace
            self._preparing_of[tenant] -= 1
            if not self._preparing_of[tenant]:
                del self._preparing_of[tenant]
            return None, None

    def _launch_prepared(self) -> None:
        with self._changed:
            ready = list(self._prepared)
            self._prepared.clear()
        unsendable: list[tuple[Outcome, tracing.DeliveryTrace | None]] = []
        for claim, prepared, started_at, trace in ready:
            self._launch(claim, prepared, started_at, trace, unsendable)
        if unsendable:
            self._record(unsendable)

    def _launch(self, claim: Claim, prepared: access.Prepared, started_at: datetime,
                trace: tracing.DeliveryTrace | None,
                unsendable: list[tuple[Outcome, tracing.DeliveryTrace | None]]) -> None:
        # The attempt's span starts here, on the engine's thread, also for an attempt prepared off-thread
        # (its token fetch or proxy lookup is not part of the HTTP attempt); it adds the traceparent.
        if trace is not None:
            trace.attempt_started(prepared.headers)
        if prepared.error:  # no token, or the proxied host refused: a failed attempt, recorded
            result = sending.attempt_failed_early(prepared)
            if trace is not None:
                trace.attempt_finished(result)
            unsendable.append((Outcome(claim, started_at, result), trace))
            return
        curl = self._idle.pop() if self._idle else pycurl.Curl()
        try:
            attempt = sending.attempt_open(curl, claim, prepared)
        except Exception as exc:  # noqa: BLE001 - libcurl refused an option: a failed attempt, recorded
            curl.reset()
            self._idle.append(curl)
            result = AttemptResult(status=None, body="", duration_ms=0, error=f"invalid_url: {exc}"[:200],
                                   retry_after=None)
            if trace is not None:
                trace.attempt_finished(result)
            unsendable.append((Outcome(claim, timezone.now(), result), trace))
            return
        self._running[id(curl)] = (curl, attempt, claim, started_at, prepared, trace)
        self._multi.add_handle(curl)

    def _finish(self, finished: list[tuple[pycurl.Curl, int, str]]) -> None:
        outcomes = []
        for curl, code, message in finished:
            _, attempt, claim, started_at, prepared, trace = self._running.pop(id(curl))
            self._multi.remove_handle(curl)
            result = attempt.finish(code, message)
            access.after_attempt(claim.access, prepared, result)
            if trace is not None:
                trace.attempt_finished(result)
            outcomes.append((Outcome(claim, started_at, result), trace))
            curl.reset()
            self._idle.append(curl)
        self._record(outcomes)

    def _record(self, finished: list[tuple[Outcome, tracing.DeliveryTrace | None]]) -> None:
        """Hand finished attempts to the recorder thread (the engine does not wait for their record)."""
        with self._recordable:
            self._to_record.extend(finished)
            self._recordable.notify()

    # -- the claimer thread

    def _claim_loop(self) -> None:
        while True:
            with self._claimable:
                self._claimable.wait_for(lambda: self._submitted or self._claimer_stopping)
                batch = list(self._submitted)
                self._submitted.clear()
                if not batch:  # stopping, nothing left
                    return
            try:
                self._claim_now(batch)
            except Exception:  # noqa: BLE001 - the claimer must outlive any one batch
                logger.exception("engine.claim_loop_failed")
            try:
                connections.close_all()  # its connection goes back to the pool (or is closed: no pool)
            except Exception:  # noqa: BLE001 - as above
                logger.exception("engine.claimer_close_failed")

    def _claim_now(self, batch: list[str]) -> None:
        """Claim what was submitted since the last call, in one call; the engine thread sends what was claimed."""
        traces: dict[str, tracing.DeliveryTrace] = {}
        if tracing.ENABLED:
            with self._changed:
                origins = {i: self._origins.pop(i, None) for i in batch}
        try:
            close_old_connections()
            with tracing.batch("herald.claim.batch", len(batch)) as claim_batch:
                result = deliveries_claim(delivery_ids=batch)
                if claim_batch is not None:
                    traces = tracing.delivery_traces(result.claims, claim_batch, origins)
        except Exception:  # noqa: BLE001 - nothing was claimed, or the leases run out: beat sends them again
            logger.exception("engine.claim_failed", extra={"deliveries": len(batch)})
            self._release(len(batch))
            return
        self._release(len(batch) - len(result.claims))  # duplicates, parked, not due: nothing to send
        with self._changed:
            self._claimed.append((result, traces))
        self._wake()

    # -- the recorder thread

    def _record_loop(self) -> None:
        while True:
            with self._recordable:
                self._recordable.wait_for(lambda: self._to_record or self._recorder_stopping)
                finished, self._to_record = self._to_record, []
                if not finished:  # stopping, nothing left
                    return
            try:
                self._record_now(finished)  # releases their slots whatever happens
            except Exception:  # noqa: BLE001 - the recorder must outlive any one batch (a trace's end failing)
                logger.exception("engine.record_loop_failed")
            try:
                connections.close_all()  # its connection goes back to the pool (or is closed: no pool)
            except Exception:  # noqa: BLE001 - as above
                logger.exception("engine.recorder_close_failed")

    def _record_now(self, finished: list[tuple[Outcome, tracing.DeliveryTrace | None]]) -> None:
        outcomes = [outcome for outcome, _ in finished]
        statuses: list = [None] * len(outcomes)
        record_batch = None
        try:
            close_old_connections()
            with tracing.batch("herald.record.batch", len(outcomes)) as record_batch:
                statuses = record.deliveries_record(outcomes=outcomes, take_claimed=self._take_claimed)
        except Exception:  # noqa: BLE001 - unrecorded: the leases run out and beat sends them again
            logger.exception("engine.record_failed", extra={"deliveries": len(outcomes)})
        finally:
            self._release(len(outcomes))
            if record_batch is not None:
                for (_, trace), status in zip(finished, statuses):
                    if trace is not None:
                        trace.recorded(status, record_batch)


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


def delivery_attempt(*, delivery_id: str) -> str | None:
    """Without an engine (a prefork worker, a test): claim, send and record one attempt of the delivery on
    this thread; its new status, or None if skipped."""
    trace = None
    with tracing.batch("herald.claim.batch", 1) as claim_batch:
        claim = delivery_claim(delivery_id=delivery_id)
        if claim is not None and claim_batch is not None:
            trace = tracing.delivery_traces({delivery_id: claim}, claim_batch,
                                            {delivery_id: claim_batch.origin})[delivery_id]
    if claim is None:
        return None
    started_at = timezone.now()
    result = sending.attempt_send(claim, trace=trace)
    if trace is None:
        return record.delivery_record(claim=claim, started_at=started_at, result=result)
    status, record_batch = None, tracing.batch("herald.record.batch", 1)
    try:
        with record_batch:
            status = record.delivery_record(claim=claim, started_at=started_at, result=result)
    finally:
        trace.recorded(status, record_batch)
    return status
