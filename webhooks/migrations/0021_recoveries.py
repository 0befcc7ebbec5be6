"""Recoveries (SPEC §11), and an index of each endpoint's failed deliveries by time for their walk.

The index is built CONCURRENTLY (so outside a transaction): intake and delivery go on meanwhile.
"""
import django.contrib.postgres.fields
from django.contrib.postgres.operations import AddIndexConcurrently
import django.db.models.deletion
import webhooks.ids
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('webhooks', '0020_platform_tenants'),
    ]

    operations = [
        migrations.CreateModel(
            name='Recovery',
            fields=[
                ('id', models.CharField(default=webhooks.ids.recovery_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('since', models.DateTimeField()),
                ('until', models.DateTimeField(blank=True, null=True)),
                ('status', models.CharField(choices=[('running', 'running'), ('completed', 'completed')], default='running', max_length=16)),
                ('total', models.PositiveIntegerField(default=0)),
                ('done', models.PositiveIntegerField(default=0)),
                ('done_before', models.PositiveIntegerField(default=0)),
                ('batch', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=40), blank=True, default=list, size=None)),
                ('released_at', models.DateTimeField(blank=True, null=True)),
                ('cursor_at', models.DateTimeField(blank=True, null=True)),
                ('cursor_id', models.CharField(blank=True, default='', max_length=40)),
                ('step', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('completed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name_plural': 'recoveries',
                'ordering': ['-id'],
            },
        ),
        AddIndexConcurrently(
            model_name='delivery',
            index=models.Index(condition=models.Q(('status', 'failed')), fields=['endpoint', 'created_at', 'id'], name='delivery_failed_endpoint'),
        ),
        migrations.AddField(
            model_name='recovery',
            name='endpoint',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='recoveries', to='webhooks.endpoint'),
        ),
        migrations.AddField(
            model_name='recovery',
            name='tenant',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='recoveries', to='webhooks.tenant'),
        ),
        migrations.AddIndex(
            model_name='recovery',
            index=models.Index(condition=models.Q(('status', 'running')), fields=['updated_at'], name='recovery_running'),
        ),
    ]
