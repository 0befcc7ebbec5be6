"""Beat's dispatcher: the relay's step, then what was lost published again, and parked deliveries handed on."""
import logging
from datetime import datetime, timedelta

from django.utils import timezone

from webhooks import progress
from webhooks.conf import herald_settings
from webhooks.delivery import outbox, parked
from webhooks.delivery.publishing import broker_backlog, deliveries_enqueue
from webhooks.delivery.relay import deliveries_relay, publish_in_batches

logger = logging.getLogger("herald.delivery")


def deliveries_dispatch_due(*, batch: int | None = None) -> list[str]:
    """Beat: the relay's step (what is due and unpublished), then publish again what was lost (see
    outbox.LOST_SQL), let the probes of tripped endpoints go, and hand on the parked deliveries of
    endpoints with nothing in flight (parked.beat_hand_on).

    A full batch is followed by another at once, for up to WEBHOOK_DISPATCH_SECONDS, so a burst of
    retries coming due goes out at the workers' pace, not one batch per beat interval.
    """
    try:
        backlog = broker_backlog()
    except Exception as exc:  # broker down: nothing could be published anyway; try next run
        logger.warning("dispatch.broker_unavailable", extra={"error": repr(exc)})
        return []
    batch = batch or herald_settings.queues.WEBHOOK_DISPATCH_BATCH
    ids = deliveries_relay(batch=batch)
    main, retries = herald_settings.queues.main, herald_settings.queues.retries
    cutoffs = _lost_cutoffs(backlog, progress.consumed_marks())
    # Re-publications go to the retry queue (the SQL says so for every row), which workers serve in
    # turn with the main one: a backlog of fresh events cannot hold them back.
    ids += publish_in_batches(outbox.LOST_SQL, {"batch": batch, "cutoff": max(cutoffs.values()),
                                                "cutoff_main": cutoffs[main], "cutoff_retries": cutoffs[retries]})
    woken = parked.beat_hand_on()
    deliveries_enqueue(delivery_ids=woken, queue=retries, wait=True)
    return ids + woken


def _lost_cutoffs(backlog: dict[str, int], marks: dict[str, datetime]) -> dict[str, datetime]:
    """Per queue: an unclaimed delivery published before this is no longer waiting in it (see outbox.LOST_SQL)."""
    window = timedelta(seconds=herald_settings.queues.WEBHOOK_REDISPATCH_AFTER_SECONDS)
    now = timezone.now()
    never = datetime(1970, 1, 1, tzinfo=now.tzinfo)
    return {queue: now - window if not waiting else (marks[queue] - window if queue in marks else never)
            for queue, waiting in backlog.items()}
