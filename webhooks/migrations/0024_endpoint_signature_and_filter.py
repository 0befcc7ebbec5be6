"""Endpoints sign with v1 (HMAC) or v1a (ed25519), and may carry a payload filter compiled to a jsonpath
(SPEC §15, webhooks/filters.py). Additive: every existing endpoint is v1 with no filter."""

import webhooks.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0023_recovery_one_running'),
    ]

    operations = [
        migrations.AddField(
            model_name='endpoint',
            name='filter',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='filter_path',
            field=webhooks.models.JsonPathField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='signature',
            field=models.CharField(choices=[('v1', 'v1: HMAC-SHA256, a shared secret'), ('v1a', 'v1a: ed25519, a public key')], db_default='v1', default='v1', max_length=8),
        ),
    ]
