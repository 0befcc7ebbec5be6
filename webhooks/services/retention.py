"""Retention: events older than EVENT_RETENTION_DAYS whose deliveries are all final go, with their
deliveries and attempts, in batches (SPEC §7). A pending delivery is never deleted, nor its event.

Batched deletes rather than time-partitioned tables, by measurement (README, "Retention"): they meet
the throughput target on the tables as they are, and keep the event's key, the delivery's foreign keys
and every index unchanged, where partitions would need the partition key in every primary and unique
key, and could drop a day only once every delivery of that day is final.

Each batch is one short transaction: it locks the oldest events past the cutoff after a cursor (ids
are ULIDs, so id order is time order and the cutoff is an id), skipping any a manual retry holds,
and deletes the attempts, deliveries and events of those whose deliveries are all final; events
with a pending delivery are stepped over and looked at again on the next run. A manual retry locks
its delivery's event first (FOR KEY SHARE), so it either goes before the batch (which then sees the
pending delivery) or after it (and finds the delivery gone). Intake and delivery keep going
meanwhile: the rows deleted are old, and no lock is taken on anything they touch.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from webhooks import ids
from webhooks.models import Delivery, DeliveryAttempt, Event

logger = logging.getLogger("herald.retention")

_EVENT = Event._meta.db_table
_DELIVERY = Delivery._meta.db_table
_ATTEMPT = DeliveryAttempt._meta.db_table

# The batch: the oldest events past the cutoff after the cursor, locked. An event a manual retry holds
# (FOR KEY SHARE, see delivery_retry) is skipped: it is about to have a pending delivery.
_PICK_SQL = f"""
SELECT e.id FROM {_EVENT} e
 WHERE e.id > %(after)s AND e.id < %(before)s AND e.created_at < %(cutoff)s
 ORDER BY e.id
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED
"""
# Then, in a statement of its own (a snapshot taken after the locks: a retry committed before them is
# seen), which of them still have a pending delivery.
_PENDING_SQL = f"""
SELECT DISTINCT d.event_id FROM {_DELIVERY} d WHERE d.event_id = ANY(%(events)s) AND d.status = 'pending'
"""
_DELETE_SQL = f"""
WITH attempts AS (
    DELETE FROM {_ATTEMPT} a USING {_DELIVERY} d
     WHERE a.delivery_id = d.id AND d.event_id = ANY(%(events)s)
    RETURNING 1
), deliveries AS (
    DELETE FROM {_DELIVERY} d WHERE d.event_id = ANY(%(events)s) AND d.status <> 'pending'
    RETURNING 1
), events AS (
    DELETE FROM {_EVENT} e WHERE e.id = ANY(%(events)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries), (SELECT count(*) FROM attempts)
"""


@dataclass
class Pruned:
    events: int = 0
    deliveries: int = 0
    attempts: int = 0
    kept: int = 0  # events past the cutoff kept for a pending delivery
    batches: int = 0
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return self.events + self.deliveries + self.attempts


def events_prune(*, now: datetime | None = None, days: int | None = None, batch: int | None = None,
                 max_seconds: float | None = None, pause_ratio: float | None = None) -> Pruned:
    """Delete what is past retention (see the module doc), batch by batch, for up to `max_seconds`
    (the next run goes on from the oldest again). After each batch it rests `pause_ratio` times as
    long as the batch took (EVENT_RETENTION_PAUSE_RATIO), so that it never takes more than its share
    of the database from intake and delivery."""
    days = settings.EVENT_RETENTION_DAYS if days is None else days
    batch = batch or settings.EVENT_RETENTION_BATCH
    max_seconds = settings.EVENT_RETENTION_MAX_SECONDS if max_seconds is None else max_seconds
    pause_ratio = settings.EVENT_RETENTION_PAUSE_RATIO if pause_ratio is None else pause_ratio
    cutoff = (now or timezone.now()) - timedelta(days=days)
    before = ids.boundary("evt", cutoff)
    started = time.monotonic()
    pruned, after = Pruned(), "evt_"
    while time.monotonic() - started < max_seconds:
        batch_started = time.monotonic()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_PICK_SQL, {"after": after, "before": before, "cutoff": cutoff, "batch": batch})
            picked = [row[0] for row in cursor.fetchall()]
            if not picked:
                break
            cursor.execute(_PENDING_SQL, {"events": picked})
            pending = {row[0] for row in cursor.fetchall()}
            doomed = [event_id for event_id in picked if event_id not in pending]
            pruned.kept += len(picked) - len(doomed)
            if doomed:
                cursor.execute(_DELETE_SQL, {"events": doomed})
                events, deliveries, attempts = cursor.fetchone()
                pruned.events += events
                pruned.deliveries += deliveries
                pruned.attempts += attempts
        pruned.batches += 1
        after = picked[-1]
        if len(picked) < batch:
            break
        if pause_ratio > 0:
            time.sleep(pause_ratio * (time.monotonic() - batch_started))
    pruned.seconds = time.monotonic() - started
    logger.info("retention.pruned", extra={**pruned.__dict__, "cutoff": cutoff.isoformat()})
    return pruned
