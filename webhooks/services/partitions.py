"""History in partitions: events, deliveries and attempts, in partitions of HISTORY_PARTITION_DAYS days (UTC)
each, dropped whole by retention.

The three tables are partitioned by range of their ids (migration 0028): `webhooks_event` by `id`,
`webhooks_delivery` by `id`, `webhooks_deliveryattempt` by `delivery_id`. Ids are ULIDs, so a span of days is a
range of ids (`ids.boundary` of its first midnight to the one after its last day), and a delivery's id extends
its event's (a check, `delivery_extends_event`): an event, its deliveries and their attempts always lie in the
same partition, whenever the attempts are made. Each table also has a default partition, which takes any row no
other partition covers: an id made by hand, days whose partition was not made in time, and the few rows
retention moves on. Nothing is ever refused for want of a partition.

Partitions follow each other without gaps: the next one starts where the newest ends, an earlier one (made for
an import of old history) ends where the oldest starts; the first one a database gets starts on a day that is a
multiple of the span from a Monday (so weeks run Monday to Sunday). Changing HISTORY_PARTITION_DAYS changes the
partitions made from then on. Names say a partition's first day (`webhooks_event_p20261203`); its bounds are read
from the catalog.

How long a partition is, is a trade, measured (docs/benchmarks.md, "History"): PostgreSQL 15 plans and locks
every partition a statement may touch, so each statement on these tables costs more with every partition the
retention window holds (daily partitions, 35 of them, took a quarter more PostgreSQL CPU per intake request and an
eighth more database time per dispatcher run than the tables had before); and a partition is dropped once all of it is past the cutoff, so an
event may be kept up to a span longer than EVENT_RETENTION_DAYS. A week: 30 days of retention in 5 or 6
partitions, an event kept up to 37 days.

This module owns the partitions' DDL (their names, bounds and per-partition indexes) and the two things done
with them, both from beat's retention task (webhooks/services/retention.py, which calls them first):
- `ensure`: partitions are made DAYS_AHEAD days ahead (under the tables' lock, given up after LOCK_TIMEOUT_MS:
  there are days to spare). A span whose range already has rows in the default partition (beat was down that
  long) is left to the default partition, with a warning;
- `drop`: a partition past retention goes whole. The events that still have a pending delivery are copied out
  with all their deliveries and attempts first, while intake and delivery go on. Then, under a brief ACCESS
  EXCLUSIVE lock of the three tables (taken with LOCK_TIMEOUT_MS: a busy moment makes it give up, and
  retention try again after a rest, rather than queue intake behind it), what changed since the copies is
  read again, the three partitions are detached, and the copies go back in, into the default partitions
  (their ids unchanged: the outbox, leases and API links still find them), where retention's batched deletes
  take them once they are final. The detached tables are dropped after the lock (their files unlinked
  without it). Dropping fires no delete trigger, so the delivery counts (DeliveryCount, migration 0016) are
  corrected by what the dropped partition held; the copies count themselves again as they go back in. What
  the lock costs intake grows with the rows moved (their inserts, their foreign keys checked at commit): about
  40 µs a moved delivery with its attempt on the 2-core box (9,000 of them, with 2,250 events: 340-380 ms;
  the black-box year scenario logs each drop's `locked_ms`).

PostgreSQL asks for the partition key in every primary and unique key. Events and deliveries are keyed by it
already; an attempt's primary key is (id, delivery_id) (its id comes from a sequence and stays unique); a
delivery's unique (event_id, endpoint_id) is an index of each partition (`UNIQUE_PER_PARTITION`): all of an
event's deliveries lie in one partition, so that is the same rule.
"""
from __future__ import annotations

import logging
import re
from time import monotonic
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone

from django.db import connection, transaction
from django.db.utils import IntegrityError, OperationalError

from webhooks import ids
from webhooks.conf import herald_settings
from webhooks.delivery import leases, outbox
from webhooks.models import Delivery, DeliveryAttempt, Event

logger = logging.getLogger("herald.retention")

DAYS_AHEAD = 3  # partitions cover the days to come this far ahead of today (pg_partman's default is 4)
LOCK_TIMEOUT_MS = 50  # how long a drop waits for its locks (intake queues behind it meanwhile) before it leaves
# the partition to the next run
# Partition maintenance is one at a time, across hosts (two beats): a transaction-level advisory lock ('hprt').
_LOCK = int.from_bytes(b"hprt", "big")


@dataclass(frozen=True)
class Partitioned:
    table: str
    key: str  # the column the table is partitioned by
    prefix: str  # the ids of that column ("evt", "dlv")


EVENTS = Partitioned(Event._meta.db_table, "id", "evt")
DELIVERIES = Partitioned(Delivery._meta.db_table, "id", "dlv")
ATTEMPTS = Partitioned(DeliveryAttempt._meta.db_table, "delivery_id", "dlv")
TABLES = (EVENTS, DELIVERIES, ATTEMPTS)
# Unique indexes PostgreSQL cannot hold on the partitioned table (they lack the partition key): made on each
# partition. {table: [(suffix, columns)]}
UNIQUE_PER_PARTITION = {DELIVERIES.table: [("event_endpoint", "(event_id, endpoint_id)")]}

_BOUND = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")
_ANCHOR = date(1970, 1, 5)  # a Monday: weekly partitions start on Mondays


@dataclass(frozen=True)
class Span:
    """One partition's days: [first, end), `end` the day after its last."""

    first: date
    end: date

    def start(self) -> datetime:
        return datetime.combine(self.first, time(), tzinfo=timezone.utc)

    def stop(self) -> datetime:
        return datetime.combine(self.end, time(), tzinfo=timezone.utc)

    def covers(self, day: date) -> bool:
        return self.first <= day < self.end


def name(table: str, span: Span) -> str:
    return f"{table}_p{span.first:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def bounds(prefix: str, span: Span) -> tuple[str, str]:
    """The ids of `prefix` made in `span`: [from, to)."""
    return ids.boundary(prefix, span.start()), ids.boundary(prefix, span.stop())


def today() -> date:
    return datetime.now(timezone.utc).date()


def span_days() -> int:
    return herald_settings.retention.HISTORY_PARTITION_DAYS


def aligned(day: date, days: int) -> Span:
    """The span of `days` days holding `day` when spans start every `days` days from a Monday (1970-01-05)."""
    first = day - timedelta(days=(day - _ANCHOR).days % days)
    return Span(first, first + timedelta(days=days))


def create_sql(part: Partitioned, span: Span | None) -> list[str]:
    """The statements that make one partition of `part` (a span's, or with `span` None the default) and its
    per-partition unique indexes."""
    if span is None:
        table = default_name(part.table)
        statements = [f"CREATE TABLE {table} PARTITION OF {part.table} DEFAULT"]
    else:
        table = name(part.table, span)
        low, high = bounds(part.prefix, span)
        statements = [f"CREATE TABLE {table} PARTITION OF {part.table} FOR VALUES FROM ('{low}') TO ('{high}')"]
    statements += [f"CREATE UNIQUE INDEX {table}_{suffix} ON {table} {columns}"
                   for suffix, columns in UNIQUE_PER_PARTITION.get(part.table, [])]
    return statements


def spans(cursor=None) -> list[Span]:
    """The partitions there are (of the events' table, which is made first and dropped last), oldest first, from
    their bounds in the catalog."""
    def read(cursor) -> list[Span]:
        cursor.execute("""SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                           WHERE i.inhparent = %s::regclass""", [EVENTS.table])
        found = []
        for (bound,) in cursor.fetchall():
            match = _BOUND.search(bound)
            if match:  # not the default partition
                low, high = (ids.time_of(value) for value in match.groups())
                found.append(Span(low.date(), high.date()))
        return sorted(found, key=lambda span: span.first)

    if cursor is not None:
        return read(cursor)
    with connection.cursor() as cursor:
        return read(cursor)


def covering(day: date) -> Span | None:
    """The partition whose span holds `day`, if one does."""
    return next((span for span in spans() if span.covers(day)), None)


def plan(existing: list[Span], first: date, last: date, days: int) -> list[Span]:
    """The spans to make so that partitions cover every day from `first` to `last`, without gaps: after the newest
    (from its end), before the oldest (to its start), or, with none yet, aligned."""
    if not existing:
        existing = [aligned(first, days)]
        made = list(existing)
    else:
        made = []
    newest, oldest = existing[-1], existing[0]
    while newest.end <= last:
        newest = Span(newest.end, newest.end + timedelta(days=days))
        made.append(newest)
    while oldest.first > first:
        oldest = Span(oldest.first - timedelta(days=days), oldest.first)
        made.append(oldest)
    return sorted(made, key=lambda span: span.first)


def ensure(*, first: date | None = None, last: date | None = None) -> list[str]:
    """Make the partitions that cover every day from `first` (yesterday) to `last` (DAYS_AHEAD days from today) and
    do not exist yet; the names made. A span whose range has rows in a default partition already is skipped
    (logged): those rows stay where they are."""
    first = first or today() - timedelta(days=1)
    last = last or today() + timedelta(days=DAYS_AHEAD)
    drop_detached()  # a drop's leftovers first: their names are the partitions' names
    made: list[str] = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
        # a partition is made under its table's lock, as a drop is: a busy moment leaves the rest to the next run
        cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        for span in plan(spans(cursor), first, last, span_days()):
            try:
                with transaction.atomic():  # a savepoint: a span that cannot be made leaves the others
                    for part in TABLES:
                        for statement in create_sql(part, span):
                            cursor.execute(statement)
                made += [name(part.table, span) for part in TABLES]
            except IntegrityError as exc:  # the default partition holds rows of that span
                logger.warning("partitions.span_left_to_default", extra={
                    "first": span.first.isoformat(), "end": span.end.isoformat(), "error": str(exc)})
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
                    raise
                logger.info("partitions.make_postponed", extra={"first": span.first.isoformat()})
                break
    if made:
        logger.info("partitions.made", extra={"partitions": len(made), "first": made[0], "last": made[-1]})
    return made


@dataclass
class Dropped:
    span: Span
    events: int = 0
    deliveries: int = 0
    attempts: int = 0
    moved_events: int = 0  # kept for a pending delivery: moved on into the default partitions
    dropped: bool = False
    locked_seconds: float = 0.0  # from asking for the tables' lock to the commit that let it go


def drop(span: Span) -> Dropped:
    """Drop one span's partitions (see the module doc), moving on the events that still have a pending delivery,
    whole; `dropped` False if its locks were not had within LOCK_TIMEOUT_MS (nothing changed: the caller tries
    again later)."""
    names = {part: name(part.table, span) for part in TABLES}
    tables = {"events": names[EVENTS], "deliveries": names[DELIVERIES], "attempts": names[ATTEMPTS]}
    low, high = bounds(DELIVERIES.prefix, span)
    result = Dropped(span)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [names[EVENTS]])
            if not cursor.fetchone()[0]:
                return result  # another beat's retention dropped it meanwhile
            # Counted before the tables' lock, for the log and the caller's totals: only a pending delivery's
            # retry can add to an old partition meanwhile, and those are moved on, not dropped.
            cursor.execute(f"""SELECT (SELECT count(*) FROM {names[EVENTS]}), (SELECT count(*) FROM {names[DELIVERIES]}),
                                      (SELECT count(*) FROM {names[ATTEMPTS]})""")
            counted = cursor.fetchone()
            # The copies are made before the lock, while intake and delivery go on (reading the partitions
            # holds nobody back); under it only what changed since is read again.
            cursor.execute(_COPY_OUT_SQL.format(**tables))
            cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            locking = monotonic()
            cursor.execute(f"LOCK TABLE {EVENTS.table}, {DELIVERIES.table}, {ATTEMPTS.table} IN ACCESS EXCLUSIVE MODE")
            cursor.execute(_CATCH_UP_SQL.format(**tables))
            cursor.execute("""SELECT (SELECT count(*) FROM herald_moved_events),
                                     (SELECT count(*) FROM herald_moved_deliveries),
                                     (SELECT count(*) FROM herald_moved_attempts)""")
            moved = cursor.fetchone()
            # the counts of what goes without a delete trigger (the copies count themselves as they go back in)
            cursor.execute(f"""SELECT herald_delivery_count_add(
                                 -(SELECT count(*) FROM {names[DELIVERIES]} WHERE status = 'pending'),
                                 -(SELECT count(*) FROM {names[DELIVERIES]} WHERE status = 'failed'))""")
            # detached, not dropped: a drop would unlink their files at commit, under the lock (the tables go after it)
            for part in TABLES:
                cursor.execute(f"ALTER TABLE {part.table} DETACH PARTITION {names[part]}")
            cursor.execute(_MOVE_IN_SQL)
            # what the outbox and the leases still held of the dropped deliveries (nothing, when all were final)
            for table in (outbox.TABLE, leases.TABLE):
                cursor.execute(f"""DELETE FROM {table} x WHERE x.delivery_id >= %(low)s AND x.delivery_id < %(high)s
                                     AND NOT EXISTS (SELECT 1 FROM herald_moved_deliveries m WHERE m.id = x.delivery_id)""",
                               {"low": low, "high": high})
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available: a busy moment
            raise
        logger.info("partitions.drop_postponed", extra={"first": span.first.isoformat()})
        return result
    result.locked_seconds = monotonic() - locking
    drop_detached()
    result.dropped = True
    result.moved_events = moved[0]
    result.events, result.deliveries, result.attempts = (total - kept for total, kept in zip(counted, moved))
    logger.info("partitions.dropped", extra={"first": span.first.isoformat(), "end": span.end.isoformat(),
                                             "events": result.events,
                                             "deliveries": result.deliveries, "attempts": result.attempts,
                                             "moved_events": result.moved_events,
                                             "locked_ms": round(result.locked_seconds * 1000, 1)})
    return result


# Before the lock: the events of the partition that have a pending delivery, with all their deliveries (each
# with the version of its row, `xmin`) and attempts, into temporary tables (dropped at commit), indexed for the
# catch-up. Each statement reads its own snapshot; the catch-up makes them agree.
_COPY_OUT_SQL = """
CREATE TEMPORARY TABLE herald_moved_events ON COMMIT DROP AS
SELECT e.* FROM {events} e WHERE e.id IN (SELECT d.event_id FROM {deliveries} d WHERE d.status = 'pending');
CREATE TEMPORARY TABLE herald_moved_deliveries ON COMMIT DROP AS
SELECT d.*, d.xmin AS herald_seen FROM {deliveries} d WHERE d.event_id IN (SELECT id FROM herald_moved_events);
CREATE TEMPORARY TABLE herald_moved_attempts ON COMMIT DROP AS
SELECT a.* FROM {attempts} a WHERE a.delivery_id IN (SELECT id FROM herald_moved_deliveries);
CREATE INDEX ON herald_moved_events (id);
CREATE INDEX ON herald_moved_deliveries (id);
CREATE INDEX ON herald_moved_attempts (delivery_id);
ANALYZE herald_moved_events, herald_moved_deliveries, herald_moved_attempts;
"""
# Under the lock: what changed since the copies. A delivery's row gets a new version (xmin) whenever anything
# of it changes, and an attempt is only ever written with its delivery (webhooks/sql/delivery_record.sql, the
# poll acknowledgement): a delivery whose row is no longer the one copied, or is gone, is "stale", and its
# event's deliveries and their attempts are copied again. Events change only by going, with their deliveries
# (a deleted tenant's erasure): a stale delivery's event that is gone is not put back. A delivery that became
# pending since (a failed one retried by hand) brings its event along. Every lookup is by key (LATERAL ...
# LIMIT 1, arrays): a few thousand index probes, where a join the planner would hash reads the whole partition.
_CATCH_UP_SQL = """
CREATE TEMPORARY TABLE herald_moved_stale ON COMMIT DROP AS
SELECT m.id, m.event_id FROM herald_moved_deliveries m
  LEFT JOIN LATERAL (SELECT d.xmin FROM {deliveries} d WHERE d.id = m.id LIMIT 1) now ON true
 WHERE now.xmin IS NULL OR now.xmin <> m.herald_seen;
CREATE TEMPORARY TABLE herald_moved_touched ON COMMIT DROP AS
SELECT event_id AS id FROM herald_moved_stale
 UNION
SELECT d.event_id FROM {deliveries} d
 WHERE d.id = ANY(ARRAY(SELECT p.id FROM {deliveries} p WHERE p.status = 'pending'
                        EXCEPT SELECT m.id FROM herald_moved_deliveries m WHERE m.status = 'pending'));
DELETE FROM herald_moved_events WHERE id IN (SELECT id FROM herald_moved_touched);
DELETE FROM herald_moved_deliveries WHERE event_id IN (SELECT id FROM herald_moved_touched);
DELETE FROM herald_moved_attempts a WHERE a.delivery_id IN (SELECT s.id FROM herald_moved_stale s);
INSERT INTO herald_moved_events
SELECT e.* FROM {events} e WHERE e.id = ANY(ARRAY(SELECT id FROM herald_moved_touched));
WITH fresh AS (
    INSERT INTO herald_moved_deliveries
    SELECT d.*, d.xmin FROM {deliveries} d WHERE d.event_id = ANY(ARRAY(SELECT id FROM herald_moved_events
                                                                         WHERE id IN (SELECT id FROM herald_moved_touched)))
    RETURNING id
)
INSERT INTO herald_moved_attempts
SELECT a.* FROM {attempts} a WHERE a.delivery_id = ANY(ARRAY(SELECT id FROM fresh))
   AND a.delivery_id NOT IN (SELECT delivery_id FROM herald_moved_attempts);
ALTER TABLE herald_moved_deliveries DROP COLUMN herald_seen;
"""
# After the drop: back into the tables, where no partition but the default ones covers them any more (in id
# order, as their indexes are).
_MOVE_IN_SQL = f"""
INSERT INTO {EVENTS.table} SELECT * FROM herald_moved_events ORDER BY id;
INSERT INTO {DELIVERIES.table} SELECT * FROM herald_moved_deliveries ORDER BY id;
INSERT INTO {ATTEMPTS.table} SELECT * FROM herald_moved_attempts ORDER BY delivery_id, number;
"""


def drop_detached() -> list[str]:
    """Drop the tables a drop detached (their names are a partition's, but no table holds them as one any more):
    its own at once, and any a process that died in between left. Nobody reads them, so nobody waits."""
    with connection.cursor() as cursor:
        cursor.execute("""SELECT c.relname FROM pg_class c
                           WHERE c.relname ~ %s AND c.relkind = 'r' AND NOT c.relispartition
                             AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = %s::regclass)""",
                       [f"^({'|'.join(part.table for part in TABLES)})_p[0-9]{{8}}$", EVENTS.table])
        detached = sorted(row[0] for row in cursor.fetchall())
        if detached:
            cursor.execute(f"DROP TABLE IF EXISTS {', '.join(detached)}")
    return detached


def droppable(cutoff: datetime) -> list[Span]:
    """The partitions that end at or before `cutoff`, oldest first (a partition is dropped whole, once all of it is
    past retention)."""
    return [span for span in spans() if span.stop() <= cutoff]
