"""One running recovery per endpoint (SPEC §11: a second is 409 `recovery_in_progress`), held by a unique
partial index. An endpoint that has several running already (made before this rule) keeps its oldest
running; the later ones are marked completed where they stand (what they had not resent yet can be
recovered again once the oldest completes)."""

from django.db import migrations, models

_ONE_RUNNING_SQL = """
UPDATE webhooks_recovery r SET status = 'completed', completed_at = now(), updated_at = now(), batch = '{}'
 WHERE r.status = 'running'
   AND EXISTS (SELECT 1 FROM webhooks_recovery o
                WHERE o.endpoint_id = r.endpoint_id AND o.status = 'running' AND o.id < r.id)
"""


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0022_endpoint_access'),
    ]

    operations = [
        migrations.RunSQL(_ONE_RUNNING_SQL, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name='recovery',
            constraint=models.UniqueConstraint(condition=models.Q(('status', 'running')), fields=('endpoint',),
                                               name='recovery_one_running'),
        ),
    ]
