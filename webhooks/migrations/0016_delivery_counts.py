"""Pending and failed deliveries counted as rows change, for /metrics (DeliveryCount).

/metrics counted them at every scrape (index-only scans of two partial indexes): 37 ms of database
time at 5M deliveries (100k pending, 237k failed), growing with the rows. Now triggers on the
delivery table keep the two numbers in a few shard rows, and a scrape adds up the shards.

Triggers rather than a line in each writer's SQL: deliveries change status in intake's insert, the
claim and record functions, a manual retry, an endpoint disabled or deleted, retention, and whatever
comes next; a writer that forgot its line would make the count drift for ever. A trigger counts
every one of them, and adds nothing to the delivery SQL.

What it costs the hot paths:
- an insert statement (intake, one per event) runs one statement-level trigger that counts its new
  rows by status (its transition table) and adds them to a shard: one row written;
- an update fires a row trigger only when it changes `status` (the WHEN is checked before anything
  is queued): a record that schedules a retry, a claim that parks, a publication pay nothing; a
  record that ends a delivery adds -1 pending (and +1 failed) to a shard;
- a delete statement (retention's batch) counts its old rows by status, once per statement.

A writer adds to a shard that no other transaction in progress holds: it tries the transaction-level
advisory locks of the 64 shards, starting from one chosen by its backend's pid, and takes the first
it gets (its own again, if it holds one already); only when all 64 are held by transactions in
progress does it wait for its own. So writers do not queue behind one another on a counter row, and
the counter adds no lock wait (and no deadlock) between them in practice.
"""
from django.db import migrations, models

SHARDS = 64
# the advisory locks' first key: 'hrld' as an int4 (beat's leader lock uses the one-bigint form: another key space)
LOCK_CLASS = int.from_bytes(b"hrld", "big")

# Adds a change to a shard that no other open transaction holds (see above): the writer's own first,
# the next ones after it, and only when all are held does it wait for its own.
ADD = rf"""
CREATE OR REPLACE FUNCTION herald_delivery_count_add(p_pending bigint, p_failed bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_first integer := pg_backend_pid() % {SHARDS};
    v_shard integer;
BEGIN
    IF p_pending = 0 AND p_failed = 0 THEN
        RETURN;
    END IF;
    FOR i IN 0..{SHARDS - 1} LOOP
        v_shard := (v_first + i) % {SHARDS};
        EXIT WHEN pg_try_advisory_xact_lock({LOCK_CLASS}, v_shard);
        v_shard := NULL;
    END LOOP;
    IF v_shard IS NULL THEN
        v_shard := v_first;
        PERFORM pg_advisory_xact_lock({LOCK_CLASS}, v_shard);
    END IF;
    INSERT INTO webhooks_deliverycount AS c (shard, pending, failed) VALUES (v_shard, p_pending, p_failed)
    ON CONFLICT (shard) DO UPDATE SET pending = c.pending + EXCLUDED.pending, failed = c.failed + EXCLUDED.failed;
END
$fn$;
"""

# Every trigger's function: what one statement or one row changed, added to a shard.
COUNTED = r"""
CREATE OR REPLACE FUNCTION herald_delivery_counted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM webhooks_deliverycount;
    ELSIF TG_LEVEL = 'ROW' THEN
        -- an update that changed the row's status (the trigger's WHEN)
        PERFORM herald_delivery_count_add((NEW.status = 'pending')::integer - (OLD.status = 'pending')::integer,
                                          (NEW.status = 'failed')::integer - (OLD.status = 'failed')::integer);
    ELSE
        -- an insert or a delete statement: its rows, in the transition table both triggers name `changed`
        PERFORM herald_delivery_count_add(
                    CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END * count(*) FILTER (WHERE status = 'pending'),
                    CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END * count(*) FILTER (WHERE status = 'failed'))
           FROM changed;
    END IF;
    RETURN NULL;
END
$fn$;
"""

# Writers wait for the lock until the triggers and the first count are in place together, so that no
# change is counted twice or missed.
LOCK = "LOCK TABLE webhooks_delivery IN SHARE ROW EXCLUSIVE MODE"
TRIGGERS = [
    """CREATE TRIGGER delivery_count_insert AFTER INSERT ON webhooks_delivery
       REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counted()""",
    """CREATE TRIGGER delivery_count_update AFTER UPDATE OF status ON webhooks_delivery
       FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION herald_delivery_counted()""",
    """CREATE TRIGGER delivery_count_delete AFTER DELETE ON webhooks_delivery
       REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counted()""",
    """CREATE TRIGGER delivery_count_truncate AFTER TRUNCATE ON webhooks_delivery
       FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counted()""",
]
# the deliveries there are now, from the two partial indexes (delivery_pending_order, delivery_failed)
FIRST_COUNT = """
INSERT INTO webhooks_deliverycount (shard, pending, failed)
SELECT 0, (SELECT count(*) FROM webhooks_delivery WHERE status = 'pending'),
          (SELECT count(*) FROM webhooks_delivery WHERE status = 'failed')
"""
DROP = [f"DROP TRIGGER {name} ON webhooks_delivery" for name in (
    "delivery_count_insert", "delivery_count_update", "delivery_count_delete", "delivery_count_truncate")] + [
    "DROP FUNCTION herald_delivery_counted()", "DROP FUNCTION herald_delivery_count_add(bigint, bigint)"]


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0015_heartbeats"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeliveryCount",
            fields=[
                ("shard", models.SmallIntegerField(primary_key=True, serialize=False)),
                ("pending", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
            ],
        ),
        # Each function goes as one statement (a list), not through Django's splitting on semicolons.
        migrations.RunSQL([LOCK, ADD, COUNTED, *TRIGGERS, FIRST_COUNT], DROP),
    ]
