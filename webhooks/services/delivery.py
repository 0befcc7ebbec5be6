"""Delivery services: claim a due delivery with a lease, send one signed attempt, record it, decide.

PostgreSQL holds every bit of state (attempt_count, next_attempt_at, the lease), so a lost or
duplicated Celery message can neither lose a delivery nor send it twice at once.
"""
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from webhooks import metrics, retry_policy, signing, transport
from webhooks.logcontext import request_id
from webhooks.publishing import broker_backlog, deliveries_enqueue
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, EndpointSecret, Event

logger = logging.getLogger("herald.delivery")

_DELIVERY = Delivery._meta.db_table
_ATTEMPT = DeliveryAttempt._meta.db_table
_EVENT = Event._meta.db_table
_ENDPOINT = Endpoint._meta.db_table
_SECRET = EndpointSecret._meta.db_table

# One statement claims the delivery and loads everything the attempt needs. Only a pending, due
# delivery whose lease is free can be claimed, so of two workers holding the same task exactly
# one gets a row back; the attempt number is taken here too.
_CLAIM_SQL = f"""
WITH claimed AS (
    UPDATE {_DELIVERY}
       SET locked_until = now() + make_interval(secs => %(lease)s),
           attempt_count = attempt_count + 1,
           updated_at = now()
     WHERE id = %(id)s AND status = 'pending' AND next_attempt_at <= now()
       AND (locked_until IS NULL OR locked_until < now())
    RETURNING attempt_count, locked_until, event_id, endpoint_id
)
SELECT c.attempt_count, c.locked_until, c.event_id, c.endpoint_id, e.payload, e.request_id,
       ep.url, ep.enabled AND ep.deleted_at IS NULL, ep.deleted_at IS NOT NULL, ep.failing_since IS NOT NULL,
       ARRAY(SELECT s.secret FROM {_SECRET} s
              WHERE s.endpoint_id = ep.id AND (s.expires_at IS NULL OR s.expires_at > now())
              ORDER BY s.created_at DESC, s.id DESC)
  FROM claimed c JOIN {_EVENT} e ON e.id = c.event_id JOIN {_ENDPOINT} ep ON ep.id = c.endpoint_id
"""

# One statement records the attempt and moves the delivery on, fenced by the lease we took: if it
# ran out and another worker claimed the delivery, that worker's outcome stands (ours is still
# recorded, truthfully).
_RECORD_SQL = f"""
WITH attempt AS (
    INSERT INTO {_ATTEMPT} (delivery_id, number, started_at, duration_ms, response_status, response_body, error,
                            created_at)
    VALUES (%(id)s, %(number)s, %(started_at)s, %(duration_ms)s, %(response_status)s, %(response_body)s,
            %(error)s, now())
)
UPDATE {_DELIVERY}
   SET status = %(status)s, next_attempt_at = %(next_attempt_at)s, locked_until = NULL, enqueued_at = NULL,
       attempt_count = %(number)s, updated_at = now()
 WHERE id = %(id)s AND locked_until = %(lease_end)s
"""

# What beat's dispatcher publishes, oldest due first:
# - a retry that has come due (record cleared enqueued_at);
# - a delivery claimed by a worker that died (its lease ran out with no record);
# - a delivery published over WEBHOOK_REDISPATCH_AFTER_SECONDS ago, never claimed, and older than
#   every message its queue still holds: queues are FIFO, so if the main queue holds N messages, the
#   N most recently published unclaimed deliveries of intake are presumed waiting there and older
#   ones lost (flush, restart); likewise for the periodic queue and what the system re-published
#   (enqueued_at moved past created_at). This keeps a long backlog from being published again and
#   again while it waits its turn, and still finds a lost task within the window.
_DISPATCH_SQL = f"""
WITH waiting_main AS (
    SELECT id FROM {_DELIVERY}
     WHERE status = 'pending' AND locked_until IS NULL AND enqueued_at = created_at
     ORDER BY enqueued_at DESC
     LIMIT %(in_main)s
), waiting_periodic AS (
    SELECT id FROM {_DELIVERY}
     WHERE status = 'pending' AND locked_until IS NULL AND enqueued_at > created_at
     ORDER BY enqueued_at DESC
     LIMIT %(in_periodic)s
), due AS (
    SELECT id FROM {_DELIVERY}
     WHERE status = 'pending' AND next_attempt_at <= now()
       AND (locked_until IS NULL OR locked_until < now())
       AND (enqueued_at IS NULL
            OR locked_until IS NOT NULL
            OR (enqueued_at < now() - make_interval(secs => %(redispatch)s)
                AND id NOT IN (SELECT id FROM waiting_main) AND id NOT IN (SELECT id FROM waiting_periodic)))
     ORDER BY next_attempt_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
)
UPDATE {_DELIVERY} SET enqueued_at = now(), locked_until = NULL
 WHERE id IN (SELECT id FROM due)
RETURNING id
"""


@dataclass(frozen=True)
class Claim:
    """A delivery this worker holds until `lease_end`, with what its attempt needs."""

    delivery_id: str
    number: int
    lease_end: datetime
    event_id: str
    endpoint_id: str
    payload: bytes
    request_id: str
    url: str
    endpoint_active: bool
    endpoint_deleted: bool
    endpoint_failing: bool
    secrets: list[str]


@functools.lru_cache(maxsize=4)
def _parse_schedule(text: str) -> tuple[int, ...]:
    return retry_policy.parse_schedule(text)


def _schedule() -> tuple[int, ...]:
    return _parse_schedule(settings.WEBHOOK_RETRY_SCHEDULE)  # parsed once, not on every failed attempt


def delivery_claim(*, delivery_id: str) -> Claim | None:
    """Take the lease on a due delivery; None if it is not due, not pending, or another worker has it."""
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, {"id": delivery_id, "lease": settings.WEBHOOK_LEASE_SECONDS})
        row = cursor.fetchone()
    if row is None:
        return None
    return Claim(delivery_id, row[0], row[1], row[2], row[3], bytes(row[4]), row[5], row[6], row[7], row[8],
                 row[9], list(row[10]))


def delivery_attempt(*, delivery_id: str) -> str | None:
    """Claim, send and record one attempt of the delivery; return its new status, or None if skipped."""
    claim = delivery_claim(delivery_id=delivery_id)
    if claim is None:
        return None  # not due, already done, or another worker holds it: a duplicate task is harmless
    token = request_id.set(claim.request_id)
    try:
        return _attempt_claimed(claim)
    finally:
        request_id.reset(token)


def _attempt_claimed(claim: Claim) -> str:
    if not claim.endpoint_active:
        status = Delivery.CANCELLED if claim.endpoint_deleted else Delivery.FAILED
        Delivery.objects.filter(pk=claim.delivery_id, locked_until=claim.lease_end).update(
            status=status, next_attempt_at=None, locked_until=None, enqueued_at=None,
            attempt_count=claim.number - 1, updated_at=timezone.now())
        return status
    started_at = timezone.now()
    headers = signing.webhook_headers(secrets=claim.secrets, msg_id=claim.event_id, timestamp=int(time.time()),
                                      body=claim.payload, user_agent=f"Herald/{settings.HERALD_VERSION}")
    result = transport.send(url=claim.url, body=claim.payload, headers=headers,
                            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
                            allow_private_networks=settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS)
    metrics.record_attempt(result)
    return delivery_record(claim=claim, started_at=started_at, result=result)


def delivery_decide(*, number: int, result: transport.AttemptResult, now: datetime) -> tuple[str, datetime | None]:
    """The delivery's next state after attempt `number`: succeeded, pending until a retry, or failed."""
    if result.ok:
        return Delivery.SUCCEEDED, None
    if result.status == 410:
        return Delivery.FAILED, None
    retry_after = None
    if result.status in (429, 503):
        retry_after = retry_policy.parse_retry_after(result.retry_after, now=now)
    delay = retry_policy.next_delay(attempt_number=number, schedule=_schedule(),
                                    jitter=settings.WEBHOOK_RETRY_JITTER, retry_after=retry_after)
    if delay is None:
        return Delivery.FAILED, None
    return Delivery.PENDING, now + timedelta(seconds=delay)


def delivery_record(*, claim: Claim, started_at: datetime, result: transport.AttemptResult) -> str:
    """Record the attempt truthfully, move the delivery on, and keep the endpoint's failure clock."""
    now = timezone.now()
    status, next_at = delivery_decide(number=claim.number, result=result, now=now)
    endpoints = Endpoint.objects.filter(pk=claim.endpoint_id)
    endpoint_writes = []  # the endpoint row is written only when its state changes
    if result.ok and claim.endpoint_failing:
        endpoint_writes.append(lambda: endpoints.update(failing_since=None))
    elif not result.ok and not claim.endpoint_failing:
        endpoint_writes.append(lambda: endpoints.filter(failing_since__isnull=True).update(failing_since=now))
    if result.status == 410:
        endpoint_writes.append(lambda: endpoints.update(enabled=False, disabled_reason="receiver answered 410 Gone",
                                                        updated_at=now))
    # Usually one statement, atomic by itself; a transaction only when the endpoint changes too.
    with transaction.atomic() if endpoint_writes else contextlib.nullcontext(), connection.cursor() as cursor:
        cursor.execute(_RECORD_SQL, {
            "id": claim.delivery_id, "number": claim.number, "started_at": started_at,
            "duration_ms": result.duration_ms, "response_status": result.status, "response_body": result.body,
            "error": result.error[:500], "status": status, "next_attempt_at": next_at, "lease_end": claim.lease_end,
        })
        for write in endpoint_writes:
            write()
    logger.info("delivery.attempt", extra={
        "delivery_id": claim.delivery_id, "event_id": claim.event_id, "endpoint_id": claim.endpoint_id,
        "attempt": claim.number, "response_status": result.status, "error": result.error,
        "duration_ms": result.duration_ms, "outcome": status})
    return status


def deliveries_dispatch_due(*, batch: int | None = None) -> list[str]:
    """Publish a task for every due delivery that needs one (beat); see _DISPATCH_SQL for which."""
    try:
        backlog = broker_backlog()
    except Exception as exc:  # broker down: nothing could be published anyway; try next run
        logger.warning("dispatch.broker_unavailable", extra={"error": repr(exc)})
        return []
    with connection.cursor() as cursor:
        cursor.execute(_DISPATCH_SQL, {"redispatch": settings.WEBHOOK_REDISPATCH_AFTER_SECONDS,
                                       "batch": batch or settings.WEBHOOK_DISPATCH_BATCH,
                                       "in_main": backlog[settings.CELERY_TASK_DEFAULT_QUEUE],
                                       "in_periodic": backlog[settings.HERALD_PERIODIC_QUEUE]})
        ids = [row[0] for row in cursor.fetchall()]
    if ids:  # if the broker is still down they stay due, and the next run picks them up again
        # Retries and recovered deliveries go to the periodic queue, which workers serve in turn
        # with the main one: a backlog of fresh events cannot hold them back.
        deliveries_enqueue(delivery_ids=ids, inline=True, queue=settings.HERALD_PERIODIC_QUEUE)
    return ids


@transaction.atomic
def delivery_retry(*, delivery: Delivery) -> Delivery:
    """Manual retry: a finished delivery becomes pending and is sent at once; a pending one is left be."""
    now = timezone.now()
    updated = Delivery.objects.filter(
        pk=delivery.pk, status__in=[Delivery.FAILED, Delivery.SUCCEEDED]
    ).update(status=Delivery.PENDING, next_attempt_at=now, enqueued_at=now, locked_until=None, updated_at=now)
    if updated:
        delivery_ids = [delivery.pk]  # re-published by the system: the periodic queue, like retries
        transaction.on_commit(lambda: deliveries_enqueue(delivery_ids=delivery_ids,
                                                         queue=settings.HERALD_PERIODIC_QUEUE), robust=True)
    delivery.refresh_from_db()
    return delivery


def endpoints_disable_failing(*, now: datetime | None = None) -> int:
    """Disable endpoints that have failed continuously for WEBHOOK_DISABLE_AFTER_SECONDS."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS)
    return Endpoint.objects.filter(enabled=True, deleted_at__isnull=True, failing_since__lte=cutoff).update(
        enabled=False, disabled_reason="failing continuously", updated_at=now)
