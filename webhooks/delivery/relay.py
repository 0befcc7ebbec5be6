"""The relay: publishes the tasks of deliveries that are due and not yet published, from PostgreSQL.

A delivery that needs a message has a row in the outbox (DeliveryOutbox, written by webhooks/delivery/outbox.py),
written due and unpublished by intake, by a failed attempt's record (its retry, due at
`next_attempt_at`) and by a manual retry. Every threaded worker runs a relay thread that wakes when the
doorbell rings (a Redis message sent after each intake commit, see webhooks/delivery/publishing.py) and
otherwise every WEBHOOK_RELAY_POLL_SECONDS, and publishes what is due, fairly across tenants and within the
publish window (webhooks/delivery/scheduling.py chooses): one UPDATE marks a pass's rows published
(`FOR UPDATE SKIP LOCKED`, so relays of several workers share the work and never publish a delivery twice)
and its ids go out as `webhooks.deliver_many` messages: first attempts to the main queue, retries to the
retry queue. While the window is full and rows are due, the relay waits for room instead of for the
doorbell: the worker's own claims ring `leases.window_freed` as they make it (the next pass starts at once),
and it looks anyway every ROOM_POLL_SECONDS (room made by another worker's claims).

Beat's dispatcher runs the same step, so deliveries still go out with no relay running (a prefork
worker runs none), at its interval instead of at once.
"""
from __future__ import annotations

import logging
import threading
import time

from django.db import connection, transaction

from webhooks import tracing
from webhooks.conf import herald_settings
from webhooks.delivery import leases, outbox, scheduling
from webhooks.delivery.publishing import _redis, doorbell_channel, publish

logger = logging.getLogger("herald.relay")

# While the publish window is full, a relay looks for room at least this often (the claims free it; this
# process's ring `leases.window_freed` at once, another worker's are seen here).
ROOM_POLL_SECONDS = 0.02
# The dispatcher's passes (and a test's) share one rotation; each relay thread has its own.
_scheduler = scheduling.Scheduler()


def deliveries_relay(*, batch: int | None = None, scheduler: scheduling.Scheduler | None = None) -> list[str]:
    """Publish due, unpublished deliveries, fairly across tenants and within the publish window (see
    webhooks/delivery/scheduling.py); the ids published.

    A pass that fills the room is followed by the next at once, and one that finds the window full waits
    for room (until this process's next claim, or ROOM_POLL_SECONDS: the workers' claims make it), both for up to
    WEBHOOK_DISPATCH_SECONDS. If the broker fails after a pass is marked, the pass is unmarked and the run
    stops (see publish_in_batches).
    """
    scheduler = scheduler or _scheduler
    batch = batch or herald_settings.queues.WEBHOOK_DISPATCH_BATCH
    window = herald_settings.queues.WEBHOOK_PUBLISH_WINDOW
    deadline = time.monotonic() + herald_settings.queues.WEBHOOK_DISPATCH_SECONDS
    published: list[str] = []
    while True:
        leases.window_freed.clear()  # before counting: any claim from here on makes room this pass does not see
        with tracing.suppressed(), transaction.atomic():
            window_room = scheduler.room(window=window)
            chosen = scheduler.take(min(batch, window_room))
        if chosen.rows:
            if not _publish(chosen.rows):
                return published
            published += [row[0] for row in chosen.rows]
        if not chosen.more or time.monotonic() >= deadline:
            return published
        if len(chosen.rows) >= window_room:
            leases.window_freed.wait(ROOM_POLL_SECONDS)  # the window is full: the workers' claims make room


def publish_in_batches(sql: str, params: dict) -> list[str]:
    """Run `sql`, which marks up to `params["batch"]` outbox rows published and returns (delivery id, for
    the retry queue?, published_at) for each, and publish them in one round trip to the broker; again at
    once while batches come full, for up to WEBHOOK_DISPATCH_SECONDS. The ids published.

    If the broker fails (or, on RabbitMQ, does not confirm) after a batch is marked, the batch is
    unmarked and the run stops: the next relay pass or dispatcher run publishes it again. A failure
    nobody sees (a broker that loses what it confirmed) leaves rows that look published: once their
    messages are overdue the dispatcher finds them lost and publishes them again.
    """
    deadline = time.monotonic() + herald_settings.queues.WEBHOOK_DISPATCH_SECONDS
    published: list[str] = []
    while True:
        # Most passes find nothing: with tracing on, their statement makes no span (a trace a second).
        with tracing.suppressed(), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if rows:
            if not _publish(rows):
                return published
            published += [row[0] for row in rows]
        if len(rows) < params["batch"] or time.monotonic() >= deadline:
            return published


def _publish(rows: list[tuple]) -> bool:
    """Publish (delivery id, for the retry queue?, published_at, ...) rows, in their order, in one round trip
    to the broker; if it fails, unmark them (they are due again) and say so."""
    main, retries = herald_settings.queues.main, herald_settings.queues.retries
    mark = max(row[2] for row in rows)
    ids = [row[0] for row in rows]
    if publish([(queue, part, mark) for queue, part in (
            (main, [row[0] for row in rows if not row[1]]), (retries, [row[0] for row in rows if row[1]]))
            if part], traceparents=tracing.event_traceparents(delivery_ids=ids) if tracing.ENABLED else None):
        return True
    outbox.unmark(ids, [row[2] for row in rows])
    return False


class Relay:
    """A worker's relay thread (see the module doc)."""

    def __init__(self) -> None:
        self._scheduler = scheduling.Scheduler()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="herald-relay", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        pubsub = None
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = _redis().pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(doorbell_channel())
                if self._scheduler.backlog:  # more is due than the last run could publish: go on at once
                    while pubsub.get_message(timeout=0) is not None:
                        pass
                else:
                    self._wait_for_ring(pubsub)
            except Exception as exc:  # noqa: BLE001 - Redis down: poll PostgreSQL meanwhile
                logger.warning("relay.doorbell_unavailable", extra={"error": repr(exc)})
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001 - its connection is gone already
                        pass
                pubsub = None
                self._stop.wait(herald_settings.queues.WEBHOOK_RELAY_POLL_SECONDS)
            if self._stop.is_set():
                break
            try:
                deliveries_relay(scheduler=self._scheduler)
            except Exception:  # noqa: BLE001 - the next ring or poll tries again
                self._scheduler.backlog = False
                logger.exception("relay.failed")
            finally:
                connection.close()  # back to the worker's pool
        if pubsub is not None:
            pubsub.close()

    def _wait_for_ring(self, pubsub) -> None:
        """Until the doorbell rings or the poll interval passes (checking for a stop every 0.2 s);
        rings that came meanwhile are answered by the one run that follows."""
        deadline = time.monotonic() + herald_settings.queues.WEBHOOK_RELAY_POLL_SECONDS
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or pubsub.get_message(timeout=min(0.2, remaining)) is not None:
                break
        while pubsub.get_message(timeout=0) is not None:
            pass


_relay: Relay | None = None


def start() -> Relay:
    global _relay
    if _relay is None:
        _relay = Relay()
    return _relay
