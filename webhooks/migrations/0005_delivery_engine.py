"""The delivery engine's state: per-endpoint cap and breaker, parked deliveries, leases in a table of their own.

Also drops webhooks_delivery's single-column foreign-key indexes and their LIKE twins: the composite
indexes lead with each key, and every index is rewritten with the row on each attempt's record.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0004_delivery_waiting_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='DeliveryLease',
            fields=[
                ('delivery', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='lease', serialize=False, to='webhooks.delivery')),
                ('until', models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name='deliverylease',
            name='endpoint',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='webhooks.endpoint'),
        ),
        # Attempts in flight at the upgrade keep their lease in the new table.
        migrations.RunSQL(
            "INSERT INTO webhooks_deliverylease (delivery_id, endpoint_id, until) "
            "SELECT id, endpoint_id, locked_until FROM webhooks_delivery WHERE locked_until > now()",
            "UPDATE webhooks_delivery d SET locked_until = l.until FROM webhooks_deliverylease l "
            "WHERE l.delivery_id = d.id"),
        migrations.RemoveIndex(
            model_name='delivery',
            name='delivery_due',
        ),
        migrations.RemoveIndex(
            model_name='delivery',
            name='delivery_waiting',
        ),
        migrations.RemoveField(
            model_name='delivery',
            name='locked_until',
        ),
        migrations.AddField(
            model_name='delivery',
            name='parked_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='consecutive_failures',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='failed_probes',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='max_in_flight',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='next_probe_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='tripped_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='delivery',
            name='endpoint',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='deliveries', to='webhooks.endpoint'),
        ),
        migrations.AlterField(
            model_name='delivery',
            name='event',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='webhooks.event'),
        ),
        migrations.AlterField(
            model_name='delivery',
            name='tenant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='deliveries', to='webhooks.tenant'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('parked_at__isnull', True), ('status', 'pending')), fields=['next_attempt_at'], name='delivery_due'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('enqueued_at__isnull', False), ('status', 'pending')), fields=['-enqueued_at'], name='delivery_waiting'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('parked_at__isnull', False)), fields=['endpoint', 'id'], name='delivery_parked'),
        ),
        migrations.AddIndex(
            model_name='endpoint',
            index=models.Index(condition=models.Q(('tripped_at__isnull', False)), fields=['next_probe_at'], name='endpoint_tripped'),
        ),
        migrations.AddIndex(
            model_name='deliverylease',
            index=models.Index(fields=['endpoint', 'until'], name='lease_endpoint'),
        ),
    ]
