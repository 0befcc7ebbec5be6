"""Polling endpoints (SPEC §12): an endpoint's `kind` (http or poll), and a poll endpoint's served order.

Both additive: `kind` has a database default (`http`), so rows written by SQL that does not name it are
HTTP endpoints as before; `poll_seq` is NULL for every delivery that is not a poll endpoint's served one,
and its partial index has no entry for them (nothing for the delivery hot paths to maintain). The index
is built concurrently: on a large delivery table a plain CREATE INDEX would hold intake's inserts.
"""
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ('webhooks', '0016_delivery_counts'),
    ]

    operations = [
        migrations.AddField(
            model_name='delivery',
            name='poll_seq',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='kind',
            field=models.CharField(choices=[('http', 'http: Herald POSTs each message to its URL'),
                                            ('poll', 'poll: its consumer reads its messages')],
                                   db_default='http', default='http', max_length=8),
        ),
        migrations.AlterField(
            model_name='endpoint',
            name='url',
            field=models.URLField(blank=True, max_length=2000),
        ),
        AddIndexConcurrently(
            model_name='delivery',
            index=models.Index(condition=models.Q(('poll_seq__isnull', False)), fields=['endpoint', 'poll_seq'],
                               name='delivery_poll_seq'),
        ),
    ]
