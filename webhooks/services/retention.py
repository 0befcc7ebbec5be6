"""Retention: events older than EVENT_RETENTION_DAYS whose deliveries are all final go, with their
deliveries and attempts (SPEC §7). A pending delivery is never deleted, nor its event.

The three tables are partitioned HISTORY_PARTITION_DAYS days at a time (webhooks/services/partitions.py),
so retention works in whole partitions: one goes once all of it is past the cutoff (so an event is kept
between EVENT_RETENTION_DAYS and a partition's span more), dropped in one short transaction, with the few
events that still have a pending delivery moved on, whole, into the default partitions. A drop costs the
same whatever the partition held: no row is deleted one by one, no index entry removed, nothing left for
VACUUM. Svix's users met the other way's limits at scale ("When we delete data older than 14 days, query
hangs", svix#1933); batched deletes managed about 112,000 rows/s here (bench `year`, before the partitions).

Batches remain for what lies in the default partitions: the events moved on (taken once their deliveries
are final), and any row no other partition covered (an id not made by Herald, days beat did not make a
partition for in time). Each batch is one short transaction: it locks the oldest events past the cutoff
after a cursor (ids are ULIDs, so id order is time order and the cutoff is an id), skipping any a manual
retry holds, and deletes the attempts, deliveries and events of those whose deliveries are all final;
events with a pending delivery are stepped over and looked at again on the next run. A manual retry locks
its delivery's event first (FOR KEY SHARE), so it either goes before the batch (which then sees the
pending delivery) or after it (and finds the delivery gone); a partition's drop waits at most
partitions.LOCK_TIMEOUT_MS for the retry's transaction and otherwise tries again after a rest (DROP_TRIES
times in a run), then leaves it to the next run.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from django.db import connection, transaction
from django.utils import timezone

from webhooks import ids
from webhooks.conf import herald_settings
from webhooks.delivery import attempts, deliveries, endpoints, leases, outbox
from webhooks.services import partitions
from webhooks.models import (Delivery, Endpoint, EndpointAccess, EndpointSecret, Event, PortalLink,
                             Recovery, Tenant)

logger = logging.getLogger("herald.retention")

_EVENT = Event._meta.db_table
DROP_REST_SECONDS = 1.0
# A drop that did not get its locks within partitions.LOCK_TIMEOUT_MS (a transaction on the tables ran longer
# than that just then) tries again after the rest, up to this many times in a run; then the next run goes on.
DROP_TRIES = 10
_DELIVERY = Delivery._meta.db_table

# The batch: the oldest events of the default partition past the cutoff after the cursor, locked. An event a
# manual retry holds (FOR KEY SHARE, see delivery_retry) is skipped: it is about to have a pending delivery.
_PICK_SQL = f"""
SELECT e.id FROM {partitions.default_name(_EVENT)} e
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
    {attempts.delete_of_events("%(events)s")}
), deliveries AS (
    {deliveries.delete_final_of_events("%(events)s")}
), events AS (
    DELETE FROM {_EVENT} e WHERE e.id = ANY(%(events)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries), (SELECT count(*) FROM attempts)
"""


class Pacer:
    """Runs batches, each one short transaction, for up to `max_seconds` in all; after each it rests
    `pause_ratio` times as long as the batch took (EVENT_RETENTION_PAUSE_RATIO), so that it never
    takes more than its share of the database from intake and delivery. Retention and the erasure of
    deleted tenants (and intake's part of it, intake/tenants.py) share it."""

    def __init__(self, *, max_seconds: float | None = None, pause_ratio: float | None = None) -> None:
        self.max_seconds = herald_settings.retention.EVENT_RETENTION_MAX_SECONDS if max_seconds is None else max_seconds
        self.pause_ratio = herald_settings.retention.EVENT_RETENTION_PAUSE_RATIO if pause_ratio is None else pause_ratio
        self.started = time.monotonic()
        self.batches = 0

    @property
    def out_of_time(self) -> bool:
        return time.monotonic() - self.started >= self.max_seconds

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def run(self, batch: Callable[[], bool], *, min_rest: float = 0.0) -> bool:
        """Call `batch` (it returns whether there is more to do) until it is done: True; or until the
        time is up: False. Between two, at least `min_rest` seconds."""
        while not self.out_of_time:
            batch_started = time.monotonic()
            more = batch()
            self.batches += 1
            if not more:
                return True
            rest = max(self.pause_ratio * (time.monotonic() - batch_started), min_rest)
            if rest > 0:
                time.sleep(rest)
        return False


@dataclass
class Pruned:
    events: int = 0
    deliveries: int = 0
    attempts: int = 0
    kept: int = 0  # events past the cutoff kept for a pending delivery (stepped over by a batch)
    partitions: int = 0  # partitions dropped
    days: int = 0  # the days they held
    moved: int = 0  # events of theirs moved on, for a pending delivery, into the default partitions
    batches: int = 0
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return self.events + self.deliveries + self.attempts


def events_prune(*, now: datetime | None = None, days: int | None = None, batch: int | None = None,
                 max_seconds: float | None = None, pause_ratio: float | None = None) -> Pruned:
    """Make the coming days' partitions, then delete what is past retention (see the module doc): whole days
    first, then the default partitions batch by batch, for up to `max_seconds` (the next run goes on from the
    oldest again), paced by a Pacer."""
    days = herald_settings.retention.EVENT_RETENTION_DAYS if days is None else days
    batch = batch or herald_settings.retention.EVENT_RETENTION_BATCH
    cutoff = (now or timezone.now()) - timedelta(days=days)
    before = ids.boundary("evt", cutoff)
    partitions.ensure()
    pacer = Pacer(max_seconds=max_seconds, pause_ratio=pause_ratio)
    pruned, after = Pruned(), "evt_"
    droppable = partitions.droppable(cutoff)

    postponed = 0

    def one_partition() -> bool:
        nonlocal postponed
        dropped = partitions.drop(droppable[0])
        if not dropped.dropped:  # its locks were busy: again after the rest, or at the next run
            postponed += 1
            return postponed < DROP_TRIES
        droppable.pop(0)
        pruned.partitions += 1
        pruned.days += (dropped.span.end - dropped.span.first).days
        pruned.events += dropped.events
        pruned.deliveries += dropped.deliveries
        pruned.attempts += dropped.attempts
        pruned.moved += dropped.moved_events
        return bool(droppable)

    def one_batch() -> bool:
        nonlocal after
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_PICK_SQL, {"after": after, "before": before, "cutoff": cutoff, "batch": batch})
            picked = [row[0] for row in cursor.fetchall()]
            if not picked:
                return False
            cursor.execute(_PENDING_SQL, {"events": picked})
            pending = {row[0] for row in cursor.fetchall()}
            doomed = [event_id for event_id in picked if event_id not in pending]
            pruned.kept += len(picked) - len(doomed)
            if doomed:
                cursor.execute(_DELETE_SQL, {"events": doomed})
                events, deliveries, attempt_rows = cursor.fetchone()
                pruned.events += events
                pruned.deliveries += deliveries
                pruned.attempts += attempt_rows
        after = picked[-1]
        return len(picked) == batch

    if droppable:
        # A drop holds the tables' lock for some milliseconds, and every process plans its next statements
        # afresh: partitions that wait together (after an upgrade or an outage of beat) go at most one a second.
        pacer.run(one_partition, min_rest=DROP_REST_SECONDS)
    drops = pacer.batches
    pacer.run(one_batch)
    pruned.batches, pruned.seconds = pacer.batches - drops, pacer.seconds
    logger.info("retention.pruned", extra={**pruned.__dict__, "cutoff": cutoff.isoformat()})
    return pruned


# --- Erasure of a deleted tenant (SPEC §10) ---------------------------------------------------------
# Everything of the tenant on the delivery side goes, with the same batches and pacing as retention, but
# whatever the deliveries' states: its endpoints were taken down when it was deleted (so the claim
# closes whatever is still queued), and its credentials revoked. One statement per batch: it locks up
# to `batch` of the tenant's events (skipping one a manual retry holds: the next batch or run takes
# it) and deletes them with their deliveries, attempts, outbox rows and leases. The deliveries' delete
# returns their ids to the others (every part sees the same snapshot): one visit to each delivery, not
# a read and then a delete by key.
_TENANT_EVENTS_SQL = f"""
WITH picked AS (
    SELECT e.id FROM {_EVENT} e WHERE e.tenant_id = %(tenant)s LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), deliveries AS (
    {deliveries.delete_of_events_in("SELECT id FROM picked")}
), attempts AS (
    {attempts.delete_of("ARRAY(SELECT id FROM deliveries)")}
), outbox AS (
    {outbox.delete_of("SELECT id FROM deliveries")}
), leases AS (
    {leases.delete_of("delivery_id", "SELECT id FROM deliveries")}
), events AS (
    DELETE FROM {_EVENT} e WHERE e.id IN (SELECT id FROM picked) RETURNING 1
)
SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries),
       (SELECT count(*) FROM attempts) + (SELECT count(*) FROM outbox) + (SELECT count(*) FROM leases)
"""
# Then its endpoints (none has a delivery left), with their secrets, access (headers, auth, certificate),
# recoveries and any lease, a batch at a time: every row that refers to an endpoint goes with it.
_TENANT_ENDPOINTS_SQL = f"""
WITH picked AS (
    SELECT e.id FROM {Endpoint._meta.db_table} e WHERE e.tenant_id = %(tenant)s LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), secrets AS (
    DELETE FROM {EndpointSecret._meta.db_table} s WHERE s.endpoint_id IN (SELECT id FROM picked) RETURNING 1
), access AS (
    DELETE FROM {EndpointAccess._meta.db_table} x WHERE x.endpoint_id IN (SELECT id FROM picked) RETURNING 1
), recoveries AS (
    DELETE FROM {Recovery._meta.db_table} r WHERE r.endpoint_id IN (SELECT id FROM picked) RETURNING 1
), leases AS (
    {leases.delete_of("endpoint_id", "SELECT id FROM picked")}
), endpoints AS (
    {endpoints.delete_of("SELECT id FROM picked")}
)
SELECT (SELECT count(*) FROM endpoints), (SELECT count(*) FROM secrets) + (SELECT count(*) FROM access)
       + (SELECT count(*) FROM recoveries) + (SELECT count(*) FROM leases)
"""
_TENANT_PORTAL_LINKS_SQL = f"DELETE FROM {PortalLink._meta.db_table} WHERE tenant_id = %(tenant)s"
# The tenant's row itself, last, once nothing of the delivery side and no credential (intake's) refers
# to it: the foreign keys refuse it otherwise, and this statement deletes nothing.
_TENANT_ROW_SQL = f"""
DELETE FROM {Tenant._meta.db_table} t WHERE t.id = %(tenant)s AND t.deleted_at IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM {_EVENT} e WHERE e.tenant_id = t.id)
   AND NOT EXISTS (SELECT 1 FROM {_DELIVERY} d WHERE d.tenant_id = t.id)
   AND NOT EXISTS (SELECT 1 FROM {Endpoint._meta.db_table} p WHERE p.tenant_id = t.id)
"""


@dataclass
class Erased:
    events: int = 0
    deliveries: int = 0
    # attempts, outbox rows, leases, endpoints, secrets, access, recoveries, portal links, keys, credentials
    other: int = 0

    @property
    def rows(self) -> int:
        return self.events + self.deliveries + self.other


def _tenant_paths() -> list[tuple[type, str]]:
    """Every model whose rows belong to a tenant, with the lookup from it to its tenant (`pk`, `tenant`,
    `credential__tenant`, `delivery__tenant`, …): found from the models' foreign keys, so a new model is
    included without a list to keep."""
    from django.apps import apps

    def direct(model) -> str | None:
        if model is Tenant:
            return "pk"
        for field in model._meta.concrete_fields:
            if field.is_relation and field.many_to_one and field.related_model is Tenant:
                return field.name
        return None

    paths = []
    for model in apps.get_models():
        path = direct(model)
        if path is None:
            for field in model._meta.concrete_fields:
                if field.is_relation and field.many_to_one and field.related_model is not None:
                    via = direct(field.related_model)
                    if via is not None and via != "pk":
                        path = f"{field.name}__{via}"
                        break
        if path is not None:
            paths.append((model, path))
    return paths


def tenant_admin_history_erase(*, tenant_id: str) -> int:
    """Delete the admin's history (django.contrib.admin's LogEntry) of a tenant's rows: each entry keeps the
    row's `str()` and the change made, which must not outlive the tenant. Run while the rows still exist
    (their keys find the entries); the number deleted. The history is small and the tenant's tables are
    not: the entries are read first, and only the rows they name are looked up, by primary key."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType
    from django.core.exceptions import ValidationError

    paths = dict(_tenant_paths())
    types = ContentType.objects.get_for_models(*paths, for_concrete_models=False)
    named: dict[type, set[str]] = {}
    by_type = {content_type.pk: model for model, content_type in types.items()}
    for content_type_id, object_id in LogEntry.objects.filter(content_type_id__in=by_type).values_list(
            "content_type_id", "object_id"):
        named.setdefault(by_type[content_type_id], set()).add(object_id)
    deleted = 0
    for model, object_ids in named.items():
        keys = []
        for object_id in object_ids:
            try:
                keys.append(model._meta.pk.to_python(object_id))
            except (ValidationError, ValueError, TypeError):
                continue
        theirs = model._default_manager.filter(pk__in=keys, **{paths[model]: tenant_id}).values_list("pk", flat=True)
        gone = [str(key) for key in theirs]
        if gone:
            deleted += LogEntry.objects.filter(content_type=types[model], object_id__in=gone)._raw_delete(
                connection.alias)
    return deleted


def tenant_erase_owned(*, tenant_id: str, pacer: Pacer, erased: Erased, batch: int | None = None) -> bool:
    """Erase a deleted tenant's admin history, events, deliveries, attempts, endpoints (with all that refers to
    them) and portal links, batch by batch under `pacer`; True once none is left, False if the time ran out (the
    next run goes on)."""
    batch = batch or herald_settings.retention.EVENT_RETENTION_BATCH
    # First, while its rows still name the entries; again on every run (an operator may have changed one of
    # its rows in the admin meanwhile). The admin's history is small: one statement per model.
    erased.other += tenant_admin_history_erase(tenant_id=tenant_id)

    def events_batch() -> bool:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_TENANT_EVENTS_SQL, {"tenant": tenant_id, "batch": batch})
            events, deliveries, other = cursor.fetchone()
        erased.events += events
        erased.deliveries += deliveries
        erased.other += other
        return events > 0

    def endpoints_batch() -> bool:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_TENANT_ENDPOINTS_SQL, {"tenant": tenant_id, "batch": batch})
            endpoints, other = cursor.fetchone()
        erased.other += endpoints + other
        return endpoints > 0

    if not pacer.run(events_batch) or Event.objects.filter(tenant_id=tenant_id).exists():
        return False  # out of time, or an event a retry held: the next run
    if Delivery.objects.filter(tenant_id=tenant_id).exists():
        return False  # (an intake that raced the deletion: the next run takes its event)
    if not pacer.run(endpoints_batch) or Endpoint.objects.filter(tenant_id=tenant_id).exists():
        return False
    with connection.cursor() as cursor:
        cursor.execute(_TENANT_PORTAL_LINKS_SQL, {"tenant": tenant_id})
        erased.other += cursor.rowcount
    return True


def tenant_erase_row(*, tenant_id: str) -> bool:
    """Delete the deleted tenant's own row, once nothing refers to it; whether it went."""
    with connection.cursor() as cursor:
        cursor.execute(_TENANT_ROW_SQL, {"tenant": tenant_id})
        return cursor.rowcount > 0
