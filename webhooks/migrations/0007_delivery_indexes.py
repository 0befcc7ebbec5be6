"""No single-column or LIKE indexes on webhooks_delivery beyond what a query uses.

A delivery row is updated twice per attempt (claim, record), and every index is written on each
update. The foreign keys' own indexes (and Django's varchar_pattern_ops twins) duplicate the leading
column of the composite indexes (tenant_status, event_endpoint, endpoint), and the LIKE index of the
primary key serves no query: 7 of the table's 15 indexes.
"""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0006_claim_and_record_functions"),
    ]

    operations = [
        migrations.AlterField(
            model_name="delivery",
            name="endpoint",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="deliveries", to="webhooks.endpoint"),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="event",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                    related_name="deliveries", to="webhooks.event"),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="tenant",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="deliveries", to="webhooks.tenant"),
        ),
        # Django names it from a hash of the table and column; look it up rather than hard-code it.
        migrations.RunSQL(
            """
            DO $$
            DECLARE name text;
            BEGIN
                SELECT indexname INTO name FROM pg_indexes
                 WHERE tablename = 'webhooks_delivery' AND indexdef LIKE '%(id varchar_pattern_ops)';
                IF name IS NOT NULL THEN
                    EXECUTE format('DROP INDEX %I', name);
                END IF;
            END $$;
            """,
            "CREATE INDEX IF NOT EXISTS webhooks_delivery_id_like ON webhooks_delivery (id varchar_pattern_ops)",
        ),
    ]
