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

from webhooks import sql

# The two functions (herald_delivery_count_add, herald_delivery_counted) are webhooks/sql/delivery_count*.sql.

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
    "delivery_count_insert", "delivery_count_update", "delivery_count_delete", "delivery_count_truncate")]


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
        # the triggers need their function now, not after the migrate
        migrations.RunPython(sql.migration_install, migrations.RunPython.noop),
        migrations.RunSQL([LOCK, *TRIGGERS, FIRST_COUNT], DROP),
    ]
