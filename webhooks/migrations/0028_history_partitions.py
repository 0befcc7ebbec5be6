"""History in partitions: events, deliveries and attempts partitioned by their ids, HISTORY_PARTITION_DAYS
days to a partition (webhooks/services/partitions.py says how, and what retention does with them).

Each of the three tables is converted in place, under the three tables' locks: renamed aside; the partitioned
table made with its columns, defaults, identity, checks, primary key (with the partition key in it, as
PostgreSQL asks: an attempt's is (id, delivery_id)), unique constraints, Django's indexes and its foreign keys;
its default partition and partitions of HISTORY_PARTITION_DAYS days from its oldest row's day (at most
EVENT_RETENTION_DAYS ago; on a new database, yesterday) to DAYS_AHEAD days ahead; the rows
copied in (older ones, and any id that is not a ULID, into the default partition, where retention's batched
deletes take them as before); its triggers (the delivery counts, migration 0016) made after the copy, so that
the rows copied are not counted twice; a check that a delivery's id extends its event's (what the partitions rest
on: an event's deliveries lie in its day), for the rows written from now on; the old table dropped. On a large history this copies every row while
intake waits: prune it first (`manage.py prune_events`) or run it in a quiet hour (docs/operations.md).

Django's own state of these models does not change: a delivery's unique (event, endpoint) is an index of each
partition (partitions.UNIQUE_PER_PARTITION), which Django cannot express; an attempt's `id` stays its model's
primary key. A later schema change of these tables must work on a partitioned table (no CREATE INDEX
CONCURRENTLY, no unique constraint without the partition key).

Not reversible: going back would copy the history out again into plain tables.
"""
import importlib
from datetime import timedelta

from django.db import migrations

from webhooks.conf import herald_settings
from webhooks.services import partitions

# the delivery counts' triggers, as migration 0016 made them (its text, not a copy of it)
COUNT_TRIGGERS = importlib.import_module("webhooks.migrations.0016_delivery_counts").TRIGGERS
# A delivery's id extends its event's (intake's fan-out makes it so: webhooks/delivery/fanout.py): an event's
# deliveries lie in its day, and its deliveries' ids are bounded by its own.
EXTENDS_EVENT = "CHECK (starts_with(id, 'dlv_' || substr(event_id, 5)))"
MODELS = {partitions.EVENTS: "Event", partitions.DELIVERIES: "Delivery", partitions.ATTEMPTS: "DeliveryAttempt"}
PRIMARY_KEYS = {partitions.EVENTS: "(id)", partitions.DELIVERIES: "(id)", partitions.ATTEMPTS: "(id, delivery_id)"}


def _catalog(cursor, table: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(name, kind, definition) of each constraint of `table`, and the names of its indexes that back none."""
    cursor.execute("""SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint
                       WHERE conrelid = %s::regclass ORDER BY conname""", [table])
    constraints = cursor.fetchall()
    cursor.execute("""SELECT i.indexrelid::regclass::text FROM pg_index i
                       WHERE i.indrelid = %s::regclass
                         AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)""", [table])
    return constraints, [row[0] for row in cursor.fetchall()]


def _convert(apps, schema_editor, cursor, part: partitions.Partitioned, first_day, last_day) -> None:
    table, aside = part.table, f"{part.table}_unpartitioned"
    model = apps.get_model("webhooks", MODELS[part])
    constraints, indexes = _catalog(cursor, table)
    cursor.execute(f"ALTER TABLE {table} RENAME TO {aside}")
    # free the index names the partitioned table takes (a constraint's name is its table's own; an index's is not)
    for name, kind, _ in constraints:
        if kind in ("p", "u"):
            cursor.execute(f'ALTER TABLE {aside} DROP CONSTRAINT "{name}"')
    for name in indexes:
        cursor.execute(f"DROP INDEX {name}")

    cursor.execute(f"""CREATE TABLE {table} (LIKE {aside} INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS
                                              INCLUDING STORAGE) PARTITION BY RANGE ({part.key})""")
    cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY {PRIMARY_KEYS[part]}")
    for name, kind, definition in constraints:
        if kind == "u" and not (table == partitions.DELIVERIES.table and name == "delivery_event_endpoint"):
            cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        elif kind == "f":
            cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    for index in model._meta.indexes:
        schema_editor.execute(index.create_sql(model, schema_editor))

    for span in [None, *partitions.plan([], first_day, last_day, herald_settings.retention.HISTORY_PARTITION_DAYS)]:
        for statement in partitions.create_sql(part, span):
            cursor.execute(statement)

    cursor.execute(f"INSERT INTO {table} SELECT * FROM {aside}")
    # the copy's foreign-key checks now, not at commit: a table with checks pending cannot be altered below
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    (sequence,) = cursor.fetchone()
    if sequence and part is partitions.ATTEMPTS:
        cursor.execute(f"SELECT setval(%s, coalesce((SELECT max(id) FROM {table}), 0) + 1, false)", [sequence])
    if part is partitions.DELIVERIES:
        for statement in COUNT_TRIGGERS:
            cursor.execute(statement)
        # the rule the partitions rest on, checked from now on (rows copied in are not: NOT VALID)
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT delivery_extends_event {EXTENDS_EVENT} NOT VALID")
    cursor.execute(f"DROP TABLE {aside}")


def forward(apps, schema_editor) -> None:
    today = partitions.today()
    last_day = today + timedelta(days=partitions.DAYS_AHEAD)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {', '.join(part.table for part in partitions.TABLES)} IN ACCESS EXCLUSIVE MODE")
        # partitions for the history there is, within retention (a new database: from yesterday)
        cursor.execute(f"SELECT min(created_at) FROM {partitions.EVENTS.table}")
        (oldest,) = cursor.fetchone()
        first_day = today - timedelta(days=1)
        if oldest is not None:
            retained = today - timedelta(days=herald_settings.retention.EVENT_RETENTION_DAYS)
            first_day = min(first_day, max(retained, oldest.date()))
        for part in partitions.TABLES:
            _convert(apps, schema_editor, cursor, part, first_day, last_day)


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0027_endpoint_destinations"),
    ]

    operations = [
        migrations.RunPython(forward),
    ]
