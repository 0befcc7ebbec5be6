"""The outbox: what needs a task message, or has one on its way, in a narrow table of its own.

Publishing used to stamp `enqueued_at` on the delivery row, a non-HOT update that rewrote the row and
its eight indexes (about 30 µs a row: 313 ms of database time for a dispatcher run publishing 10,000
due retries). Now it stamps `published_at` on a DeliveryOutbox row (two small index entries), the
delivery loses `enqueued_at` and the two indexes built on it, and a record that schedules a retry
changes no indexed column of the delivery, so it can be a HOT update (the table keeps room for that on
each page: fillfactor 90).

The functions that wrote `enqueued_at` were redefined here (they are now webhooks/sql/*.sql): the hand-on writes an outbox row for the deliveries it sends on, the claim
deletes the row of the delivery it was called for, and the record inserts one for a retry.

Existing rows move over: a pending delivery, neither parked nor claimed, gets its outbox row (published
if it had been); a claimed one gets one when its retry is recorded or, if its worker died, from the
dispatcher.
"""
import django.db.models.deletion
from django.db import migrations, models

FILL_OUTBOX = r"""
INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic)
SELECT d.id, coalesce(d.next_attempt_at, d.created_at), d.enqueued_at,
       NOT (d.attempt_count = 0 AND d.next_attempt_at = d.created_at)
  FROM webhooks_delivery d
 WHERE d.status = 'pending' AND d.parked_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM webhooks_deliverylease l WHERE l.delivery_id = d.id)
"""

RESTORE_ENQUEUED_AT = r"""
UPDATE webhooks_delivery d SET enqueued_at = o.published_at
  FROM webhooks_deliveryoutbox o WHERE o.delivery_id = d.id
"""


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0008_dispatch_marks_and_fewer_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeliveryOutbox",
            fields=[
                ("delivery", models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE,
                                                  primary_key=True, related_name="outbox", serialize=False,
                                                  to="webhooks.delivery")),
                ("due_at", models.DateTimeField()),
                ("published_at", models.DateTimeField(blank=True, null=True)),
                ("periodic", models.BooleanField(default=False)),
            ],
        ),
        migrations.RunSQL([FILL_OUTBOX], [RESTORE_ENQUEUED_AT]),
        migrations.AddIndex(
            model_name="deliveryoutbox",
            index=models.Index(condition=models.Q(("published_at__isnull", True)), fields=["due_at"], name="outbox_due"),
        ),
        migrations.AddIndex(
            model_name="deliveryoutbox",
            index=models.Index(condition=models.Q(("published_at__isnull", False)), fields=["published_at"],
                               name="outbox_published"),
        ),
        migrations.RemoveIndex(model_name="delivery", name="delivery_waiting"),
        migrations.RemoveIndex(model_name="delivery", name="delivery_due"),
        migrations.RemoveField(model_name="delivery", name="enqueued_at"),
        migrations.RunSQL(["ALTER TABLE webhooks_delivery SET (fillfactor = 90)"],
                          ["ALTER TABLE webhooks_delivery RESET (fillfactor)"]),
    ]
