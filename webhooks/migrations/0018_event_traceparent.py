"""The trace an event was recorded in (SPEC §12): a nullable column, so adding it rewrites nothing."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("webhooks", "0017_polling_endpoints")]

    operations = [
        migrations.AddField(model_name="event", name="traceparent",
                            field=models.CharField(blank=True, max_length=55, null=True)),
    ]
