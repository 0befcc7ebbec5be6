"""Telling who delivers: publish delivery tasks, ring the relays' doorbell, read each queue's backlog, and
wake the long-polls of poll endpoints (`poll_notify`).

The pending rows in PostgreSQL are the outbox. Intake publishes nothing itself: once its transaction
commits it rings the doorbell of the workers' relays (webhooks/delivery/relay.py), which publish what is due
as `webhooks.deliver_many` messages of up to WEBHOOK_ENQUEUE_CHUNK ids each. A Celery message costs
about a millisecond of CPU to build and send; the relays pay it per batch, in the workers, not per
request in the web process.

Ringing, and the few publications a web process still makes (a hand-on after an endpoint change),
go through this process's publisher thread: a request only appends to a list and answers. A
message that never reaches the broker (the process died first, the broker was down) is no worse off
than one the broker lost: beat's dispatcher finds the delivery unclaimed and publishes it again.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
from datetime import datetime

from celery import current_app
from django.db import connection
from django.utils import timezone
from kombu import Queue

from webhooks import tracing
from webhooks.conf import herald_settings

logger = logging.getLogger("herald.publishing")

# The LISTEN/NOTIFY channel of poll endpoints' new messages; the payload is the endpoint's id.
POLL_CHANNEL = "herald_poll"

# The task that takes a message of delivery ids (webhooks/tasks.py registers it under this name).
DELIVER_MANY = "webhooks.deliver_many"


def deliveries_enqueue(*, delivery_ids: list[str], queue: str | None = None, wait: bool = False,
                       mark: datetime | None = None) -> None:
    """Publish the delivery tasks of these ids: in the background (default) or now (`wait`, with the
    `mark` the messages carry: when the ids were published, by the database's clock).

    `queue` is the main queue (new events) unless given; the system's own re-publications (retries,
    recoveries, hand-ons, manual retries) go to the retry queue (herald_settings.queues.retries). A broker failure is logged,
    never raised: the rows are safe and the dispatcher publishes them again.
    """
    if not delivery_ids:
        return
    queue = queue or herald_settings.queues.main
    if wait:
        publish([(queue, list(delivery_ids), mark or timezone.now())])
    else:
        publisher.put(delivery_ids=delivery_ids, queue=queue)


def doorbell_channel() -> str:
    """The Redis channel the relays listen on (one per Herald installation: HERALD_QUEUE names it)."""
    return f"{herald_settings.queues.main}:doorbell"


_redis_clients: dict[int, object] = {}


def _redis():
    import redis

    client = _redis_clients.get(os.getpid())
    if client is None:
        client = _redis_clients[os.getpid()] = redis.Redis.from_url(
            herald_settings.queues.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return client


def _ring() -> None:
    try:
        _redis().publish(doorbell_channel(), b"")
    except Exception as exc:  # Redis down: the relays poll every WEBHOOK_RELAY_POLL_SECONDS meanwhile
        logger.warning("relay.doorbell_failed", extra={"error": repr(exc)})


def publish(batch: list[tuple[str, list[str], datetime]], traceparents: dict[str, str] | None = None) -> bool:
    """Publish (queue, ids, mark) items: per queue, messages of up to WEBHOOK_ENQUEUE_CHUNK ids, in one
    round trip. Each message carries the latest of its items' marks (when they were handed over),
    which the worker reports as its queue's progress (webhooks/progress.py). With `traceparents` (tracing
    on: the stored trace of each delivery's event), each message is sent in a `herald.outbox.publish`
    span linked to those traces (webhooks/tracing.py). False if the broker
    refused or could not be reached (logged, never raised): on RabbitMQ publisher confirms make a
    message the broker did not take count as a failure too."""
    by_queue: dict[str, tuple[list[str], datetime]] = {}
    for queue, ids, mark in batch:
        held, latest = by_queue.get(queue, ([], mark))
        by_queue[queue] = (held + ids, max(latest, mark))
    chunk = herald_settings.queues.WEBHOOK_ENQUEUE_CHUNK
    try:
        with current_app.producer_or_acquire() as producer, producer.batch():
            for queue, (ids, mark) in by_queue.items():
                for start in range(0, len(ids), chunk):
                    part = ids[start:start + chunk]
                    with (tracing.publish_span((traceparents[i] for i in part if i in traceparents),
                                               **{"messaging.destination.name": queue, "herald.deliveries": len(part)})
                          if traceparents is not None else tracing.span("herald.outbox.publish")):
                        # by name, so that publishing (below the services) never imports the tasks above them
                        current_app.send_task(DELIVER_MANY, (part, queue, mark.isoformat()), producer=producer,
                                              queue=queue, argsrepr=f"[{len(part)} ids]", kwargsrepr="")
    except Exception as exc:  # broker down: the rows are safe and the dispatcher will publish them
        ids = [i for _, part, _ in batch for i in part]
        logger.warning("delivery.enqueue_failed", extra={"delivery_ids": ids[:20], "count": len(ids),
                                                          "error": repr(exc)})
        return False
    return True


class Publisher:
    """The background publisher of one process (see the module doc); started on first use, and again
    in a forked child, which does not inherit the parent's thread. Rings that arrive while it is busy
    are answered by one ring."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: list[tuple[str, list[str], datetime]] = []
        self._ring = False
        self._ring_context = None  # tracing on: the trace of the first request that rang since the last ring
        self._busy = False
        self._pid: int | None = None

    def put(self, *, delivery_ids: list[str], queue: str) -> None:
        with self._changed:
            self._started()
            self._pending.append((queue, list(delivery_ids), timezone.now()))
            self._changed.notify_all()

    def ring(self) -> None:
        """Tell the relays that new deliveries are due (after a commit)."""
        with self._changed:
            self._started()
            if tracing.ENABLED and not self._ring:
                self._ring_context = tracing.current_context()
            self._ring = True
            self._changed.notify_all()

    def _started(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._pending, self._ring, self._busy = [], False, False  # a parent's work is the parent's
            threading.Thread(target=self._run, name="herald-publisher", daemon=True).start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything handed over has been published and rung (or has failed and been logged)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._ring and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._ring)
                batch, ring, context = self._pending, self._ring, self._ring_context
                self._pending, self._ring, self._busy, self._ring_context = [], False, True, None
            try:
                if batch:
                    publish(batch)
                if ring:
                    with tracing.attached(context), tracing.span("herald.outbox.ring"):
                        _ring()
            except Exception:  # noqa: BLE001 - the thread must outlive any one batch
                logger.exception("delivery.publisher_failed")
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()


publisher = Publisher()
# A process exiting normally (gunicorn's graceful restart, a test run) publishes what it holds first.
atexit.register(publisher.flush, 5.0)


def broker_backlog() -> dict[str, int]:
    """Messages waiting in each of Herald's queues, as the broker counts them (a queue declare, via kombu)."""
    app = current_app
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        # Not passive: a queue nobody has used yet is created empty, as a worker would create it.
        return {queue.name: Queue(queue.name, queue.exchange, queue.routing_key, channel=channel)
                .queue_declare().message_count for queue in app.conf.task_queues}


def poll_notify(*, endpoint_ids: list[str]) -> None:
    """Tell the web processes' long-polls of these poll endpoints that messages are waiting: a NOTIFY,
    which PostgreSQL delivers when the caller's transaction commits (and drops if it rolls back)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, ep) FROM unnest(%s::varchar[]) AS ep",
                       [POLL_CHANNEL, sorted(set(endpoint_ids))])
