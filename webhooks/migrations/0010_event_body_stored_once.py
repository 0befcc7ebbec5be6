"""An event's `data` is stored once, in its body (`payload`), which every attempt sends as it is.

The `data` column held the same JSON a second time: a jsonb parse and a second copy per intake
request, and twice the table for retention to delete. `Event.data` now reads it from the body.

Also drops the LIKE index Django gave the outbox's varchar key in 0009 (created at the end of that
migration, so it can only go in a later one): no query matches delivery ids by pattern.
"""
from django.db import migrations, models

DROP_OUTBOX_LIKE_INDEX = r"""
DO $$
DECLARE name text;
BEGIN
    FOR name IN SELECT indexname FROM pg_indexes
                 WHERE tablename = 'webhooks_deliveryoutbox' AND indexdef LIKE '%varchar_pattern_ops%'
    LOOP
        EXECUTE format('DROP INDEX %I', name);
    END LOOP;
END $$;
"""

# the way back: the column again, filled from the bodies
FILL_DATA = r"""
UPDATE webhooks_event SET data = (convert_from(payload, 'UTF8')::jsonb) -> 'data'
"""


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0009_delivery_outbox"),
    ]

    # (nullable first, so that the way back can add the column to a full table and then fill it)
    operations = [
        migrations.AlterField(model_name="event", name="data", field=models.JSONField(null=True)),
        migrations.RunSQL(migrations.RunSQL.noop, [FILL_DATA]),
        migrations.RemoveField(model_name="event", name="data"),
        migrations.RunSQL([DROP_OUTBOX_LIKE_INDEX], migrations.RunSQL.noop),
    ]
