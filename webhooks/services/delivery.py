"""Delivery services: claim a due delivery with a lease, send one signed attempt, record it, decide.

PostgreSQL holds every bit of state (attempt_count, next_attempt_at, the lease), so a lost or
duplicated Celery message can neither lose a delivery nor send it twice at once.
"""
import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from webhooks import metrics, retry_policy, signing, transport
from webhooks.logcontext import request_id
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, EndpointSecret

logger = logging.getLogger("herald.delivery")

_DELIVERY = Delivery._meta.db_table

# One statement: only a pending, due delivery whose lease is free can be claimed, so of two
# workers holding the same task exactly one gets a row back. The attempt number is taken here.
_CLAIM_SQL = f"""
UPDATE {_DELIVERY}
   SET locked_until = now() + make_interval(secs => %(lease)s),
       attempt_count = attempt_count + 1,
       updated_at = now()
 WHERE id = %(id)s AND status = 'pending' AND next_attempt_at <= now()
   AND (locked_until IS NULL OR locked_until < now())
RETURNING attempt_count, locked_until
"""

# Due, free, and not published recently (a task still waiting in the queue is not duplicated).
_DISPATCH_SQL = f"""
UPDATE {_DELIVERY} SET enqueued_at = now()
 WHERE id IN (
    SELECT id FROM {_DELIVERY}
     WHERE status = 'pending' AND next_attempt_at <= now()
       AND (locked_until IS NULL OR locked_until < now())
       AND (enqueued_at IS NULL OR enqueued_at < now() - make_interval(secs => %(redispatch)s))
     ORDER BY next_attempt_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED)
RETURNING id
"""


def _schedule() -> tuple[int, ...]:
    return retry_policy.parse_schedule(settings.WEBHOOK_RETRY_SCHEDULE)


def delivery_claim(*, delivery_id: str) -> tuple[int, datetime] | None:
    """Take the lease on a due delivery; return (attempt number, lease end) or None if not ours."""
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, {"id": delivery_id, "lease": settings.WEBHOOK_LEASE_SECONDS})
        return cursor.fetchone()


def delivery_attempt(*, delivery_id: str) -> str | None:
    """Claim, send and record one attempt of the delivery; return its new status, or None if skipped."""
    claim = delivery_claim(delivery_id=delivery_id)
    if claim is None:
        return None  # not due, already done, or another worker holds it: a duplicate task is harmless
    number, lease_end = claim
    delivery = Delivery.objects.select_related("event", "endpoint").get(pk=delivery_id)
    token = request_id.set(delivery.event.request_id)
    try:
        return _attempt_claimed(delivery=delivery, number=number, lease_end=lease_end)
    finally:
        request_id.reset(token)


def _attempt_claimed(*, delivery: Delivery, number: int, lease_end: datetime) -> str:
    delivery_id = delivery.pk
    endpoint = delivery.endpoint
    if endpoint.deleted_at is not None or not endpoint.enabled:
        status = Delivery.CANCELLED if endpoint.deleted_at is not None else Delivery.FAILED
        _finish(delivery_id=delivery_id, lease_end=lease_end, status=status, attempt_count=number - 1)
        return status

    body = bytes(delivery.event.payload)
    secrets = endpoint_active_secrets(endpoint=endpoint)
    started_at = timezone.now()
    headers = signing.webhook_headers(secrets=secrets, msg_id=delivery.event_id, timestamp=int(time.time()),
                                      body=body, user_agent=f"Herald/{settings.HERALD_VERSION}")
    result = transport.send(url=endpoint.url, body=body, headers=headers,
                            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
                            allow_private_networks=settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS)
    metrics.record_attempt(result)
    return delivery_record(delivery=delivery, number=number, lease_end=lease_end, started_at=started_at,
                           result=result)


def endpoint_active_secrets(*, endpoint: Endpoint) -> list[str]:
    """The secrets that sign right now: the current one and rotated-out ones still in their grace."""
    now = timezone.now()
    return list(EndpointSecret.objects.filter(endpoint=endpoint)
                .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
                .order_by("-created_at", "-id").values_list("secret", flat=True))


@transaction.atomic
def delivery_record(*, delivery: Delivery, number: int, lease_end: datetime, started_at: datetime,
                    result: transport.AttemptResult) -> str:
    """Record the attempt truthfully, then move the delivery on: succeeded, retry later, or failed."""
    DeliveryAttempt.objects.create(
        delivery=delivery, number=number, started_at=started_at, duration_ms=result.duration_ms,
        response_status=result.status, response_body=result.body, error=result.error[:500],
    )
    now = timezone.now()
    endpoint_id = delivery.endpoint_id
    if result.ok:
        status, next_at = Delivery.SUCCEEDED, None
        Endpoint.objects.filter(pk=endpoint_id, failing_since__isnull=False).update(failing_since=None)
    else:
        Endpoint.objects.filter(pk=endpoint_id, failing_since__isnull=True).update(failing_since=now)
        if result.status == 410:
            status, next_at = Delivery.FAILED, None
            Endpoint.objects.filter(pk=endpoint_id).update(enabled=False, disabled_reason="receiver answered 410 Gone",
                                                           updated_at=now)
        else:
            retry_after = None
            if result.status in (429, 503):
                retry_after = retry_policy.parse_retry_after(result.retry_after, now=now)
            delay = retry_policy.next_delay(attempt_number=number, schedule=_schedule(),
                                            jitter=settings.WEBHOOK_RETRY_JITTER, retry_after=retry_after)
            if delay is None:
                status, next_at = Delivery.FAILED, None
            else:
                status, next_at = Delivery.PENDING, now + timedelta(seconds=delay)
    _finish(delivery_id=delivery.pk, lease_end=lease_end, status=status, attempt_count=number,
            next_attempt_at=next_at)
    logger.info("delivery.attempt", extra={
        "delivery_id": delivery.pk, "event_id": delivery.event_id, "endpoint_id": endpoint_id, "attempt": number,
        "response_status": result.status, "error": result.error, "duration_ms": result.duration_ms,
        "outcome": status})
    return status


def _finish(*, delivery_id: str, lease_end: datetime, status: str, attempt_count: int,
            next_attempt_at: datetime | None = None) -> None:
    # Fenced by the lease we took: if it ran out and another worker claimed the delivery, that
    # worker's outcome stands (our attempt is still recorded above).
    Delivery.objects.filter(pk=delivery_id, locked_until=lease_end).update(
        status=status, next_attempt_at=next_attempt_at, locked_until=None, enqueued_at=None,
        attempt_count=attempt_count, updated_at=timezone.now())


def deliveries_dispatch_due(*, batch: int | None = None) -> list[str]:
    """Publish a task for every due, free delivery whose task is not already waiting (beat)."""
    from webhooks.tasks import deliver

    with connection.cursor() as cursor:
        cursor.execute(_DISPATCH_SQL, {"redispatch": settings.WEBHOOK_REDISPATCH_AFTER_SECONDS,
                                       "batch": batch or settings.WEBHOOK_DISPATCH_BATCH})
        ids = [row[0] for row in cursor.fetchall()]
    for index, delivery_id in enumerate(ids):
        try:
            deliver.delay(delivery_id)
        except Exception as exc:  # broker still down: they stay due and are picked up again later
            logger.warning("dispatch publish failed", extra={"remaining": len(ids) - index, "error": repr(exc)})
            break
    return ids


@transaction.atomic
def delivery_retry(*, delivery: Delivery) -> Delivery:
    """Manual retry: a finished delivery becomes pending and is sent at once; a pending one is left be."""
    now = timezone.now()
    updated = Delivery.objects.filter(
        pk=delivery.pk, status__in=[Delivery.FAILED, Delivery.SUCCEEDED]
    ).update(status=Delivery.PENDING, next_attempt_at=now, enqueued_at=now, locked_until=None, updated_at=now)
    if updated:
        delivery_id = delivery.pk
        transaction.on_commit(lambda: _publish(delivery_id), robust=True)
    delivery.refresh_from_db()
    return delivery


def _publish(delivery_id: str) -> None:
    from webhooks.tasks import deliver

    deliver.delay(delivery_id)


def endpoints_disable_failing(*, now: datetime | None = None) -> int:
    """Disable endpoints that have failed continuously for WEBHOOK_DISABLE_AFTER_SECONDS."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS)
    return Endpoint.objects.filter(enabled=True, deleted_at__isnull=True, failing_since__lte=cutoff).update(
        enabled=False, disabled_reason="failing continuously", updated_at=now)
