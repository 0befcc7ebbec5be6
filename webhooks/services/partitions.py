"""History in partitions: events, deliveries and attempts, one partition a day (UTC), dropped whole by retention.

The three tables are partitioned by range of their ids (migration 0028): `webhooks_event` by `id`,
`webhooks_delivery` by `id`, `webhooks_deliveryattempt` by `delivery_id`. Ids are ULIDs, so a day is a range of
ids (`ids.boundary` of its midnight to the next), and a delivery's id extends its event's: an event, its
deliveries and their attempts always lie in the same day, whenever the attempts are made. Each table also has a
default partition, which takes any row no day partition covers: an id made by hand, a day whose partition was not
made in time, and the few rows retention moves on. Nothing is ever refused for want of a partition.

This module owns the partitions' DDL (their names, bounds and per-partition indexes) and the two things done
with them, both from beat's retention task (webhooks/services/retention.py, which calls them first):
- `ensure`: each day's partitions are made DAYS_AHEAD days ahead (under the tables' lock too, given up after
  LOCK_TIMEOUT_MS: there are days to spare). A day whose range already has rows in the default partition (beat
  was down that long) is left to the default partition, with a warning;
- `drop_day`: a day past retention goes whole. Under a brief ACCESS EXCLUSIVE lock of the three tables (taken
  with LOCK_TIMEOUT_MS: a busy moment makes it give up and try at the next run, rather than queue intake behind it),
  the events that still have a pending delivery are copied out with all their deliveries and attempts, the
  three partitions are dropped, and the copies go back in, into the default partitions (their ids unchanged:
  the outbox, leases and API links still find them), where retention's batched deletes take them once they
  are final. Dropping fires no delete trigger, so the delivery counts (DeliveryCount, migration 0016) are
  corrected by what the dropped partition held; the copies count themselves again as they go back in.

PostgreSQL asks for the partition key in every primary and unique key. Events and deliveries are keyed by it
already; an attempt's primary key is (id, delivery_id) (its id comes from a sequence and stays unique); a
delivery's unique (event_id, endpoint_id) is an index of each partition (`UNIQUE_PER_PARTITION`): all of an
event's deliveries lie in one partition, so that is the same rule.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone

from django.db import connection, transaction
from django.db.utils import IntegrityError, OperationalError

from webhooks import ids
from webhooks.delivery import leases, outbox
from webhooks.models import Delivery, DeliveryAttempt, Event

logger = logging.getLogger("herald.retention")

DAYS_AHEAD = 3  # beat makes each day's partitions this many days before it starts (pg_partman's default is 4)
LOCK_TIMEOUT_MS = 50  # how long a drop waits for its locks (intake queues behind it meanwhile) before it leaves
# the day to the next run
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

_DAY_NAME = re.compile(r"_p(\d{8})$")


def day_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def bounds(prefix: str, day: date) -> tuple[str, str]:
    """The ids of `prefix` made on `day` (UTC): [from, to)."""
    start = datetime.combine(day, time(), tzinfo=timezone.utc)
    return ids.boundary(prefix, start), ids.boundary(prefix, start + timedelta(days=1))


def today() -> date:
    return datetime.now(timezone.utc).date()


def create_sql(part: Partitioned, name: str, *, day: date | None) -> list[str]:
    """The statements that make one partition of `part` (a day's, or with `day` None the default) and its
    per-partition unique indexes."""
    if day is None:
        statements = [f"CREATE TABLE {name} PARTITION OF {part.table} DEFAULT"]
    else:
        low, high = bounds(part.prefix, day)
        statements = [f"CREATE TABLE {name} PARTITION OF {part.table} FOR VALUES FROM ('{low}') TO ('{high}')"]
    statements += [f"CREATE UNIQUE INDEX {name}_{suffix} ON {name} {columns}"
                   for suffix, columns in UNIQUE_PER_PARTITION.get(part.table, [])]
    return statements


def days() -> list[date]:
    """The days that have partitions (of the events' table, which is made first and dropped last), oldest first."""
    with connection.cursor() as cursor:
        cursor.execute("""SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                           WHERE i.inhparent = %s::regclass""", [EVENTS.table])
        names = [row[0] for row in cursor.fetchall()]
    return sorted(datetime.strptime(match.group(1), "%Y%m%d").date()
                  for match in map(_DAY_NAME.search, names) if match)


def _existing(cursor) -> set[str]:
    cursor.execute("""SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       WHERE i.inhparent = ANY(%s::regclass[])""", [[part.table for part in TABLES]])
    return {row[0] for row in cursor.fetchall()}


def ensure(*, first: date | None = None, last: date | None = None) -> list[str]:
    """Make the day partitions from `first` (yesterday) to `last` (DAYS_AHEAD days from today) that do not exist
    yet; the names made. A day whose range has rows in a default partition already is skipped (logged): those
    rows stay where they are."""
    first = first or today() - timedelta(days=1)
    last = last or today() + timedelta(days=DAYS_AHEAD)
    made: list[str] = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
        # a partition is made under its table's lock, as a drop is: a busy moment leaves the rest to the next run
        cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        existing = _existing(cursor)
        day = first
        while day <= last:
            names = [day_name(part.table, day) for part in TABLES]
            if not all(name in existing for name in names):
                try:
                    with transaction.atomic():  # a savepoint: a day that cannot be made leaves the others
                        for part, name in zip(TABLES, names):
                            if name not in existing:
                                for statement in create_sql(part, name, day=day):
                                    cursor.execute(statement)
                    made += [name for name in names if name not in existing]
                except IntegrityError as exc:  # the default partition holds rows of that day
                    logger.warning("partitions.day_left_to_default", extra={"day": day.isoformat(), "error": str(exc)})
                except OperationalError as exc:
                    if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
                        raise
                    logger.info("partitions.make_postponed", extra={"day": day.isoformat()})
                    break
            day += timedelta(days=1)
    if made:
        logger.info("partitions.made", extra={"partitions": len(made), "first": made[0], "last": made[-1]})
    return made


@dataclass
class Dropped:
    day: date
    events: int = 0
    deliveries: int = 0
    attempts: int = 0
    moved_events: int = 0  # kept for a pending delivery: moved on into the default partitions
    dropped: bool = False


def drop_day(day: date) -> Dropped:
    """Drop one day's partitions (see the module doc), moving on the events that still have a pending delivery,
    whole; `dropped` False if its locks were not had within LOCK_TIMEOUT_MS (nothing changed: the next run
    tries again)."""
    names = {part: day_name(part.table, day) for part in TABLES}
    low, high = bounds(DELIVERIES.prefix, day)
    result = Dropped(day)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [names[EVENTS]])
            if not cursor.fetchone()[0]:
                return result  # another beat's retention dropped it meanwhile
            # Counted before the tables' lock, for the log and the caller's totals: only a pending delivery's
            # retry can add to an old day meanwhile, and those are moved on, not dropped.
            cursor.execute(f"""SELECT (SELECT count(*) FROM {names[EVENTS]}), (SELECT count(*) FROM {names[DELIVERIES]}),
                                      (SELECT count(*) FROM {names[ATTEMPTS]})""")
            counted = cursor.fetchone()
            cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            cursor.execute(f"LOCK TABLE {EVENTS.table}, {DELIVERIES.table}, {ATTEMPTS.table} IN ACCESS EXCLUSIVE MODE")
            cursor.execute(_MOVE_OUT_SQL.format(events=names[EVENTS], deliveries=names[DELIVERIES],
                                                attempts=names[ATTEMPTS]))
            cursor.execute("""SELECT (SELECT count(*) FROM herald_moved_events),
                                     (SELECT count(*) FROM herald_moved_deliveries),
                                     (SELECT count(*) FROM herald_moved_attempts)""")
            moved = cursor.fetchone()
            # the counts of what goes without a delete trigger (the copies count themselves as they go back in)
            cursor.execute(f"""SELECT herald_delivery_count_add(
                                 -(SELECT count(*) FROM {names[DELIVERIES]} WHERE status = 'pending'),
                                 -(SELECT count(*) FROM {names[DELIVERIES]} WHERE status = 'failed'))""")
            cursor.execute(f"DROP TABLE {names[ATTEMPTS]}, {names[DELIVERIES]}, {names[EVENTS]}")
            cursor.execute(_MOVE_IN_SQL)
            # what the outbox and the leases still held of the dropped deliveries (nothing, when all were final)
            for table in (outbox.TABLE, leases.TABLE):
                cursor.execute(f"""DELETE FROM {table} x WHERE x.delivery_id >= %(low)s AND x.delivery_id < %(high)s
                                     AND NOT EXISTS (SELECT 1 FROM herald_moved_deliveries m WHERE m.id = x.delivery_id)""",
                               {"low": low, "high": high})
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available: a busy moment
            raise
        logger.info("partitions.drop_postponed", extra={"day": day.isoformat()})
        return result
    result.dropped = True
    result.moved_events = moved[0]
    result.events, result.deliveries, result.attempts = (total - kept for total, kept in zip(counted, moved))
    logger.info("partitions.dropped", extra={"day": day.isoformat(), "events": result.events,
                                             "deliveries": result.deliveries, "attempts": result.attempts,
                                             "moved_events": result.moved_events})
    return result


# Under the lock: the events of the day that still have a pending delivery, with all their deliveries and
# attempts, into temporary tables (dropped at commit).
_MOVE_OUT_SQL = """
CREATE TEMPORARY TABLE herald_moved_events ON COMMIT DROP AS
SELECT e.* FROM {events} e WHERE e.id IN (SELECT d.event_id FROM {deliveries} d WHERE d.status = 'pending');
CREATE TEMPORARY TABLE herald_moved_deliveries ON COMMIT DROP AS
SELECT d.* FROM {deliveries} d WHERE d.event_id IN (SELECT id FROM herald_moved_events);
CREATE TEMPORARY TABLE herald_moved_attempts ON COMMIT DROP AS
SELECT a.* FROM {attempts} a WHERE a.delivery_id IN (SELECT id FROM herald_moved_deliveries);
"""
# After the drop: back into the tables, where no day partition covers them any more (the default ones).
_MOVE_IN_SQL = f"""
INSERT INTO {EVENTS.table} SELECT * FROM herald_moved_events;
INSERT INTO {DELIVERIES.table} SELECT * FROM herald_moved_deliveries;
INSERT INTO {ATTEMPTS.table} SELECT * FROM herald_moved_attempts;
"""


def droppable(cutoff: datetime) -> list[date]:
    """The days with partitions that end at or before `cutoff`, oldest first (a day is dropped whole, once all of
    it is past retention)."""
    return [day for day in days() if datetime.combine(day + timedelta(days=1), time(), tzinfo=timezone.utc) <= cutoff]

