"""Celery tasks of the intake side."""
import logging

from celery import shared_task

from intake.idempotency.prune import keys_prune_expired
from intake.tenants import tenants_erase
from webhooks.conf import herald_settings

logger = logging.getLogger("herald.idempotency")


@shared_task(name="intake.prune_idempotency_keys", ignore_result=True)
def prune_idempotency_keys() -> int:
    """Beat, hourly: delete idempotency keys past their retention, 5,000 at a time."""
    deleted, batches = keys_prune_expired(batch_size=herald_settings.api.IDEMPOTENCY_PRUNE_BATCH)
    logger.info("pruned idempotency keys", extra={"deleted": deleted, "batches": batches})
    return deleted


@shared_task(name="intake.erase_tenants", ignore_result=True,
             soft_time_limit=herald_settings.retention.EVENT_RETENTION_MAX_SECONDS + 60,
             time_limit=herald_settings.retention.EVENT_RETENTION_MAX_SECONDS + 120)
def erase_tenants() -> int:
    """Beat: erase what deleted tenants still own, in paced batches (SPEC §10); rows deleted."""
    return tenants_erase().rows
