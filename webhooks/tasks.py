"""Celery tasks: thin APIs that take ids, and call services."""
from celery import shared_task
from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime

from webhooks import progress
from webhooks.delivery import engine
from webhooks.conf import herald_settings
from webhooks.delivery.dispatcher import deliveries_dispatch_due
from webhooks.delivery.publishing import DELIVER_MANY
from webhooks.models import DISPATCHER, Heartbeat
from webhooks.services import recovery as recovery_service
from webhooks.services.endpoints import endpoints_disable_failing
from webhooks.services.retention import events_prune


@shared_task(name="webhooks.deliver", ignore_result=True)
def deliver(delivery_id: str) -> None:
    """Send one attempt of a delivery if it is due and free (claimed with a lease); in a threaded worker
    by handing it to its engine, which sends every thread's attempts together. Herald now publishes
    `deliver_many`; this one still serves messages published by earlier versions."""
    _deliver(delivery_id)


@shared_task(name=DELIVER_MANY, ignore_result=True)
def deliver_many(delivery_ids: list[str], queue: str, mark: str) -> None:
    """`deliver` for each of a message's ids; then report the message's mark as the queue's progress."""
    for delivery_id in delivery_ids:
        _deliver(delivery_id)
    progress.consumed(queue=queue, mark=parse_datetime(mark))


def _deliver(delivery_id: str) -> None:
    running = engine.running()
    if running is not None:
        running.submit(delivery_id)
    else:
        engine.delivery_attempt(delivery_id=delivery_id)


@shared_task(name="webhooks.dispatch_due", ignore_result=True)
def dispatch_due() -> int:
    """Beat: publish every due delivery whose task is not waiting; this is what recovers lost tasks."""
    published = len(deliveries_dispatch_due())
    recovery_service.recoveries_resume()
    Heartbeat.objects.update_or_create(name=DISPATCHER, defaults={"at": Now()})
    return published


@shared_task(name="webhooks.disable_failing_endpoints", ignore_result=True)
def disable_failing_endpoints() -> int:
    """Beat: disable endpoints failing continuously past WEBHOOK_DISABLE_AFTER_SECONDS."""
    return endpoints_disable_failing()


@shared_task(name="webhooks.prune_events", ignore_result=True,
             soft_time_limit=herald_settings.retention.EVENT_RETENTION_MAX_SECONDS + 60,
             time_limit=herald_settings.retention.EVENT_RETENTION_MAX_SECONDS + 120)
def prune_events() -> int:
    """Beat: delete events past EVENT_RETENTION_DAYS whose deliveries are all final (SPEC §7)."""
    return events_prune().rows


@shared_task(name="webhooks.recovery_step", ignore_result=True)
def recovery_step(recovery_id: str, step: int) -> str | None:
    """One step of a recovery (SPEC §11): count its batch's progress, release its next batch, or complete
    it; it sends the next step itself (webhooks/services/recovery.py)."""
    return recovery_service.recovery_step(recovery_id=recovery_id, step=step)
