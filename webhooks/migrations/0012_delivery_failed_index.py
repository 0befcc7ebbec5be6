"""An index of failed deliveries alone, for /metrics' failed gauge and the admin's failed filter.

Built CONCURRENTLY (so outside a transaction): intake and delivery go on while it is built on a large table.
"""
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("webhooks", "0011_endpoint_secrets_encrypted"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="delivery",
            index=models.Index(condition=models.Q(("status", "failed")), fields=["-id"], name="delivery_failed"),
        ),
    ]
