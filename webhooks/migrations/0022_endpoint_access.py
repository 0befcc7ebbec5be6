"""EndpointAccess: an endpoint's extra headers, auth and client certificate (SPEC §11), in a table of its own
(a row only for endpoints that have one), every secret encrypted (webhooks/crypto.py). Additive: no
existing table changes."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0021_recoveries'),
    ]

    operations = [
        migrations.CreateModel(
            name='EndpointAccess',
            fields=[
                ('endpoint', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='access', serialize=False, to='webhooks.endpoint')),
                ('header_names', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=64), blank=True, default=list, size=None)),
                ('encrypted_headers', models.TextField(blank=True, default='')),
                ('auth_type', models.CharField(blank=True, choices=[('basic', 'basic'), ('bearer', 'bearer'), ('oauth2_client_credentials', 'OAuth2 client credentials')], default='', max_length=32)),
                ('auth_shown', models.JSONField(blank=True, default=dict)),
                ('encrypted_auth_secret', models.TextField(blank=True, default='')),
                ('certificate', models.TextField(blank=True, default='')),
                ('certificate_subject', models.CharField(blank=True, default='', max_length=1000)),
                ('certificate_expires_at', models.DateTimeField(blank=True, null=True)),
                ('encrypted_private_key', models.TextField(blank=True, default='')),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'verbose_name_plural': 'endpoint access',
            },
        ),
    ]
