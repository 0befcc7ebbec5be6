"""Fair delivery across tenants (SPEC §10): a tenant's `delivery_weight`, and the outbox row's tenant, so that
the relays choose what to publish by tenant (webhooks/delivery/scheduling.py).

The outbox's writers that write unpublished rows in bulk (intake, a retry's record) write the tenant; a
trigger gives any other unpublished row without one its delivery's (webhooks/sql/outbox_tenant.sql): a
manual retry, a row made due again, or a writer yet to come. Its WHEN is checked before anything runs, so
the writers that give the tenant pay nothing. Existing rows get theirs here, under a lock that holds the
writers off until the trigger is in place.
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

from webhooks import sql

LOCK = "LOCK TABLE webhooks_deliveryoutbox IN SHARE ROW EXCLUSIVE MODE"
BACKFILL = """
UPDATE webhooks_deliveryoutbox o SET tenant_id = d.tenant_id
  FROM webhooks_delivery d WHERE d.id = o.delivery_id AND o.tenant_id IS NULL
"""
TRIGGER = """
CREATE TRIGGER outbox_tenant BEFORE INSERT OR UPDATE ON webhooks_deliveryoutbox
   FOR EACH ROW WHEN (NEW.tenant_id IS NULL AND NEW.published_at IS NULL) EXECUTE FUNCTION herald_outbox_tenant()
"""
DROP = "DROP TRIGGER outbox_tenant ON webhooks_deliveryoutbox"


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0025_portal_link_theme'),
    ]

    operations = [
        migrations.AddField(
            model_name='deliveryoutbox',
            name='tenant',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='webhooks.tenant'),
        ),
        migrations.AddField(
            model_name='tenant',
            name='delivery_weight',
            field=models.PositiveSmallIntegerField(default=1, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100)]),
        ),
        migrations.AddIndex(
            model_name='deliveryoutbox',
            index=models.Index(condition=models.Q(('published_at__isnull', True)), fields=['tenant', 'due_at'], name='outbox_fair'),
        ),
        migrations.AddConstraint(
            model_name='tenant',
            constraint=models.CheckConstraint(condition=models.Q(('delivery_weight__gte', 1), ('delivery_weight__lte', 100)), name='tenant_delivery_weight'),
        ),
        # the trigger needs its function now, not after the migrate
        migrations.RunPython(sql.migration_install, migrations.RunPython.noop),
        migrations.RunSQL([LOCK, BACKFILL, TRIGGER], DROP),
    ]
