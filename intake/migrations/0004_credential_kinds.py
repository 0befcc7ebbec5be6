"""Two kinds of credential (SPEC §10): tenant (as before) and platform (no tenant)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('intake', '0003_idempotency_one_transaction'),
        ('webhooks', '0020_platform_tenants'),
    ]

    operations = [
        migrations.AddField(
            model_name='apicredential',
            name='kind',
            field=models.CharField(choices=[('tenant', 'tenant'), ('platform', 'platform')], default='tenant', max_length=16),
        ),
        migrations.AlterField(
            model_name='apicredential',
            name='tenant',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='credentials', to='webhooks.tenant'),
        ),
        migrations.AddConstraint(
            model_name='apicredential',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('kind', 'tenant'), ('tenant__isnull', False)), models.Q(('kind', 'platform'), ('tenant__isnull', True)), _connector='OR'), name='credential_kind_tenant'),
        ),
    ]
