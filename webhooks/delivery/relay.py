"""The relay: publishes the tasks of deliveries that are due and not yet published, from PostgreSQL.

A delivery that needs a message has a row in the outbox (DeliveryOutbox, written by webhooks/delivery/outbox.py),
written due and unpublished by intake, by a failed attempt's record (its retry, due at
`next_attempt_at`) and by a manual retry. Every threaded worker runs a relay thread that wakes when the
doorbell rings (a Redis message sent after each intake commit, see webhooks/delivery/publishing.py) and
otherwise every WEBHOOK_RELAY_POLL_SECONDS, and publishes what is due, oldest first, in batches: one
UPDATE marks a batch's rows published (`FOR UPDATE SKIP LOCKED`, so relays of several workers share
the work and never publish a delivery twice) and its ids go out as `webhooks.deliver_many` messages:
first attempts to the main queue, retries to the retry queue.

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
from webhooks.delivery import outbox
from webhooks.delivery.publishing import _redis, doorbell_channel, publish

logger = logging.getLogger("herald.relay")


def deliveries_relay(*, batch: int | None = None) -> list[str]:
    """Publish every due, unpublished delivery (see the module doc); the ids published."""
    return publish_in_batches(outbox.MARK_DUE_SQL, {"batch": batch or herald_settings.queues.WEBHOOK_DISPATCH_BATCH})


def publish_in_batches(sql: str, params: dict) -> list[str]:
    """Run `sql`, which marks up to `params["batch"]` outbox rows published and returns (delivery id, for
    the retry queue?, published_at) for each, and publish them in one round trip to the broker; again at
    once while batches come full, for up to WEBHOOK_DISPATCH_SECONDS. The ids published.

    If the broker fails (or, on RabbitMQ, does not confirm) after a batch is marked, the batch is
    unmarked and the run stops: the next relay pass or dispatcher run publishes it again. A failure
    nobody sees (a broker that loses what it confirmed) leaves rows that look published: once their
    messages are overdue the dispatcher finds them lost and publishes them again.
    """
    main, retries = herald_settings.queues.main, herald_settings.queues.retries
    deadline = time.monotonic() + herald_settings.queues.WEBHOOK_DISPATCH_SECONDS
    published: list[str] = []
    while True:
        # Most passes find nothing: with tracing on, their statement makes no span (a trace a second).
        with tracing.suppressed(), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if rows:
            mark = max(row[2] for row in rows)
            ids = [row[0] for row in rows]
            if not publish([(queue, part, mark) for queue, part in (
                    (main, [row[0] for row in rows if not row[1]]), (retries, [row[0] for row in rows if row[1]]))
                    if part], traceparents=tracing.event_traceparents(delivery_ids=ids) if tracing.ENABLED else None):
                outbox.unmark(ids, [row[2] for row in rows])
                return published
            published += ids
        if len(rows) < params["batch"] or time.monotonic() >= deadline:
            return published


class Relay:
    """A worker's relay thread (see the module doc)."""

    def __init__(self) -> None:
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
                deliveries_relay()
            except Exception:  # noqa: BLE001 - the next ring or poll tries again
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
