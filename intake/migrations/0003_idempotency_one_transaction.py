"""Idempotency keys are written in the transaction of the request's work (issue 23): a row is a
completed request and nothing else, so the in-progress state and its lock go.

`in_progress` rows left by the previous version (requests running during the upgrade, or stale ones
of requests that died) are deleted: such a request, if it still runs, cannot complete its key and
rolls back, and the client's retry executes.
"""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("intake", "0002_key_credential_index"),
    ]

    operations = [
        migrations.RunSQL("DELETE FROM intake_idempotencykey WHERE status <> 'completed'", migrations.RunSQL.noop),
        migrations.RemoveField(model_name="idempotencykey", name="status"),
        migrations.RemoveField(model_name="idempotencykey", name="lock_token"),
        migrations.RemoveField(model_name="idempotencykey", name="locked_at"),
        migrations.AlterField(model_name="idempotencykey", name="response_status",
                              field=models.PositiveSmallIntegerField()),
        migrations.AlterField(model_name="idempotencykey", name="response_headers", field=models.JSONField()),
        migrations.AlterField(model_name="idempotencykey", name="response_body", field=models.BinaryField()),
        migrations.AddField(model_name="idempotencykey", name="response_encrypted",
                            field=models.BooleanField(default=False)),
    ]
