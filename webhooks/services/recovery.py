"""Recover an outage: resend every failed delivery of an endpoint whose event was created in [since, until).

`recovery_create` records the recovery and counts what it will resend; a task (`webhooks.recovery_step`,
run by the workers, never by a web thread) then walks the endpoint's failed deliveries in event order,
a batch at a time. Each batch goes through the manual retry (`deliveries_retry`): the deliveries become
pending and are claimed like any other, within the endpoint's cap, breaker, fifo order and throttle.
The next batch is released only once every delivery of this one has had its attempt (or was closed),
so the batches reach the receiver in event order and a long outage's backlog never floods the queues.
A step that finds its batch still under way sends itself again after WEBHOOK_RECOVER_POLL_SECONDS
(less often while nothing moves) instead of waiting; beat sends again a step that was lost
(`recoveries_resume`). An endpoint disabled or deleted meanwhile ends the recovery after its batch.

One recovery of an endpoint runs at a time: while one runs, `recovery_create` refuses another
(`RecoveryInProgress`, the API's 409 `recovery_in_progress`), race-free through a unique partial index.
A recovery resends only what was failed when it was created and has not changed since (the delivery's
`updated_at`): what a manual retry, or an earlier recovery, has sent again meanwhile is left out; and the
lease of the claim keeps any delivery from being sent twice at the same moment whatever else happens.
"""
import logging
from datetime import datetime, timedelta

from celery import current_app
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from webhooks.conf import herald_settings
from webhooks.models import Delivery, Endpoint, Recovery, Tenant
from webhooks.delivery.retries import deliveries_retry

logger = logging.getLogger("herald.recovery")

RECOVERY_STEP = "webhooks.recovery_step"  # the task (webhooks/tasks.py)

_DELIVERY = Delivery._meta.db_table

# The failed deliveries a recovery resends (index delivery_failed_endpoint), after its cursor, oldest
# event first (a delivery's created_at is its event's, and its id begins with its event's ULID).
_WALK_SQL = f"""
SELECT d.id, d.created_at FROM {_DELIVERY} d
 WHERE d.endpoint_id = %(endpoint)s AND d.status = 'failed'
   AND d.created_at >= %(since)s AND (%(until)s::timestamptz IS NULL OR d.created_at < %(until)s)
   AND d.updated_at <= %(snapshot)s
   AND (%(cursor_at)s::timestamptz IS NULL OR (d.created_at, d.id) > (%(cursor_at)s, %(cursor_id)s))
 ORDER BY d.created_at, d.id
 LIMIT %(batch)s
"""
_COUNT_SQL = f"SELECT count(*) FROM ({_WALK_SQL}) walk"

# Of a released batch, the deliveries still waiting for the attempt it released them for: pending and
# due no later than the release (a failed attempt that schedules a retry moves next_attempt_at on). The
# batch's rows are found by their keys and the rule is a FILTER, not a WHERE condition: `status = 'pending'`
# in the WHERE lets the planner read the whole partial index of pending deliveries for the ids, and during a
# recovery that index is at its largest (webhooks/sql/delivery_claim.sql says more).
_WAITING_SQL = f"""
SELECT count(*) FILTER (WHERE d.status = 'pending' AND d.next_attempt_at <= %(released_at)s) FROM {_DELIVERY} d
 WHERE d.id = ANY(%(ids)s)
"""


class RecoveryRefused(Exception):
    """The endpoint cannot be recovered now (it is disabled): nothing was recorded."""


class RecoveryInProgress(RecoveryRefused):
    """Another recovery of the endpoint is running (SPEC §11: 409 `recovery_in_progress`): nothing was
    recorded. `running` is its id."""

    def __init__(self, running: str | None) -> None:
        super().__init__(f"A recovery of this endpoint is running ({running or 'just made'}): wait for it to "
                         "complete, then recover again.")
        self.running = running


def recovery_create(*, tenant: Tenant, endpoint: Endpoint, since: datetime, until: datetime | None) -> Recovery:
    """Record a recovery of `endpoint`'s failed deliveries in [since, until), in the caller's transaction;
    its first step is sent once that commits. RecoveryRefused for a disabled endpoint, whose claims would
    only close the deliveries again; RecoveryInProgress while another recovery of the endpoint runs.

    One running per endpoint is the unique index `recovery_one_running`'s rule: of two made at the same
    moment, the second's insert waits for the first's transaction and fails once it commits (a savepoint
    keeps the caller's transaction usable). Checked first too, so that the usual refusal costs no count."""
    if not endpoint.enabled or endpoint.deleted_at is not None:
        raise RecoveryRefused("The endpoint is disabled: enable it first, then recover.")
    running = _running_of(endpoint)
    if running is not None:
        raise RecoveryInProgress(running)
    now = timezone.now()
    recovery = Recovery(tenant=tenant, endpoint=endpoint, since=since, until=until, created_at=now, updated_at=now)
    with connection.cursor() as cursor:
        cursor.execute(_COUNT_SQL, _walk_params(recovery, batch=None))
        recovery.total = cursor.fetchone()[0]
    try:
        with transaction.atomic():
            recovery.save(force_insert=True)
    except IntegrityError as exc:
        if "recovery_one_running" not in str(exc):
            raise
        raise RecoveryInProgress(_running_of(endpoint)) from None
    _send_step(recovery, countdown=0)
    logger.info("recovery.created", extra={"recovery_id": recovery.pk, "endpoint_id": endpoint.pk,
                                           "total": recovery.total})
    return recovery


def _running_of(endpoint: Endpoint) -> str | None:
    return Recovery.objects.filter(endpoint=endpoint, status=Recovery.RUNNING).values_list("pk", flat=True).first()


def recovery_step(*, recovery_id: str, step: int) -> str | None:
    """Move a recovery on by one step: count its batch's progress, or release its next batch, or complete it.

    Only the step the recovery expects runs (`step`); a duplicate (beat's resend of a step that was only
    late) finds the number moved on and does nothing. Returns the status, or None when it did nothing.
    """
    with transaction.atomic():
        recovery = (Recovery.objects.select_for_update(skip_locked=True)
                    .filter(pk=recovery_id, status=Recovery.RUNNING, step=step).first())
        if recovery is None:
            return None
        now = timezone.now()
        with connection.cursor() as cursor:
            if recovery.batch:
                cursor.execute(_WAITING_SQL, {"ids": recovery.batch, "released_at": recovery.released_at})
                waiting = cursor.fetchone()[0]
                if waiting:
                    done = recovery.done_before + len(recovery.batch) - waiting
                    # nothing moved (a tripped breaker, a slow receiver): look less often, up to every 5 s
                    slower = None if done != recovery.done else min(
                        5.0, max(herald_settings.recovery.WEBHOOK_RECOVER_POLL_SECONDS,
                                 2 * (now - recovery.updated_at).total_seconds()))
                    recovery.done = done
                    return _save_and_continue(recovery, now, countdown=slower)
                recovery.done = recovery.done_before = recovery.done_before + len(recovery.batch)
            rows = []
            # A disabled or deleted endpoint's claims would only close what is released: stop here.
            if Endpoint.objects.filter(pk=recovery.endpoint_id, enabled=True, deleted_at__isnull=True).exists():
                cursor.execute(_WALK_SQL, _walk_params(recovery, batch=herald_settings.recovery.WEBHOOK_RECOVER_BATCH))
                rows = cursor.fetchall()
        if not rows:
            recovery.status, recovery.completed_at, recovery.batch = Recovery.COMPLETED, now, []
            recovery.updated_at = now
            recovery.save()
            logger.info("recovery.completed", extra={"recovery_id": recovery.pk, "endpoint_id": recovery.endpoint_id,
                                                     "total": recovery.total, "done": recovery.done})
            return recovery.status
        # Only what is still failed and unchanged now: one resent meanwhile (by hand, by another recovery)
        # is not sent again.
        recovery.batch = deliveries_retry(delivery_ids=[row[0] for row in rows], now=now,
                                          statuses=(Delivery.FAILED,), unchanged_since=recovery.created_at)
        recovery.released_at = now
        recovery.cursor_id, recovery.cursor_at = rows[-1]
        return _save_and_continue(recovery, now, countdown=0 if not recovery.batch else None)


def _save_and_continue(recovery: Recovery, now: datetime, countdown: float | None = None) -> str:
    recovery.step += 1
    recovery.updated_at = now
    recovery.save()
    poll = herald_settings.recovery.WEBHOOK_RECOVER_POLL_SECONDS
    _send_step(recovery, countdown=poll if countdown is None else countdown)
    return recovery.status


def recoveries_resume() -> list[str]:
    """Beat: send again the expected step of every running recovery that has not moved for a while (its
    step's message was lost: a broker flush, a worker killed). The ids resumed."""
    stale = timezone.now() - timedelta(seconds=herald_settings.queues.WEBHOOK_REDISPATCH_AFTER_SECONDS)
    resumed = []
    for recovery in Recovery.objects.filter(status=Recovery.RUNNING, updated_at__lt=stale).only("id", "step")[:1000]:
        _send_step(recovery, countdown=0, on_commit=False)
        resumed.append(recovery.pk)
    return resumed


def _send_step(recovery: Recovery, *, countdown: float, on_commit: bool = True) -> None:
    # by name, like the delivery messages (webhooks/delivery/publishing.py): the task module imports this one;
    # CELERY_TASK_ROUTES sends it to the periodic queue
    step = recovery.step

    def send():
        current_app.send_task(RECOVERY_STEP, (recovery.pk, step), countdown=countdown or None)

    if on_commit:
        transaction.on_commit(send, robust=True)  # a broker that fails leaves it to beat's resume
    else:
        send()


def _walk_params(recovery: Recovery, *, batch: int | None) -> dict:
    return {"endpoint": recovery.endpoint_id, "since": recovery.since, "until": recovery.until,
            "snapshot": recovery.created_at, "cursor_at": recovery.cursor_at, "cursor_id": recovery.cursor_id,
            "batch": batch}
