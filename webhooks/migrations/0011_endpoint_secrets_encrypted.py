"""Endpoint signing secrets encrypted at rest (webhooks/crypto.py).

The column keeps its name and type (`secret`, varchar: the claim function returns it as such) and
grows to 500 characters for Fernet tokens; the model calls it `encrypted_secret`. Every stored `whsec_…` secret is encrypted under the first key of
HERALD_ENCRYPTION_KEYS (or the key derived from SECRET_KEY), so run this with the keys the processes use.
"""
from django.db import migrations, models

from webhooks import crypto


def encrypt_existing(apps, schema_editor):
    EndpointSecret = apps.get_model("webhooks", "EndpointSecret")
    for row in EndpointSecret.objects.filter(encrypted_secret__startswith="whsec_").iterator():
        EndpointSecret.objects.filter(pk=row.pk).update(encrypted_secret=crypto.encrypt(row.encrypted_secret))


def decrypt_existing(apps, schema_editor):
    EndpointSecret = apps.get_model("webhooks", "EndpointSecret")
    for row in EndpointSecret.objects.exclude(encrypted_secret__startswith="whsec_").iterator():
        EndpointSecret.objects.filter(pk=row.pk).update(encrypted_secret=crypto.decrypt(row.encrypted_secret))


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0010_event_body_stored_once"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RenameField(model_name="endpointsecret", old_name="secret", new_name="encrypted_secret"),
                migrations.AlterField(model_name="endpointsecret", name="encrypted_secret",
                                      field=models.CharField(max_length=500, db_column="secret")),
            ],
            database_operations=[
                migrations.RunSQL("ALTER TABLE webhooks_endpointsecret ALTER COLUMN secret TYPE varchar(500)",
                                  "ALTER TABLE webhooks_endpointsecret ALTER COLUMN secret TYPE varchar(200)"),
            ],
        ),
        migrations.RunPython(encrypt_existing, decrypt_existing),
    ]
