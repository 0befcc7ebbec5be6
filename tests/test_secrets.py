"""Endpoint secrets at rest: encrypted, rotated under new keys, migrated, and never sent unsigned."""
import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.conftest import create_endpoint
from webhooks import crypto
from webhooks.models import EndpointSecret
from webhooks.delivery.leases import deliveries_claim

pytestmark = pytest.mark.django_db(transaction=True)


def _key() -> str:
    out = io.StringIO()
    call_command("reencrypt_secrets", "--new-key", stdout=out)
    key = out.getvalue().strip()
    Fernet(key)  # a valid key
    return key


def test_rotation_re_encrypts_every_secret_under_the_first_key(api, settings):
    old, new = _key(), _key()
    settings.HERALD_ENCRYPTION_KEYS = [old]
    endpoints = [create_endpoint(api, f"https://{n}.example.com/") for n in range(3)]
    api.post(f"endpoints/{endpoints[0]['id']}/rotate-secret")  # two secrets for that one
    before = {row.pk: row.encrypted_secret for row in EndpointSecret.objects.all()}
    plain = {row.pk: row.secret for row in EndpointSecret.objects.all()}
    assert len(before) == 4

    settings.HERALD_ENCRYPTION_KEYS = [new, old]
    out = io.StringIO()
    call_command("reencrypt_secrets", "--batch", "3", stdout=out)
    assert "re-encrypted 4 secrets" in out.getvalue()

    settings.HERALD_ENCRYPTION_KEYS = [new]  # the old key dropped: everything still opens
    rows = {row.pk: row for row in EndpointSecret.objects.all()}
    assert all(rows[pk].encrypted_secret != before[pk] for pk in rows)
    assert {pk: row.secret for pk, row in rows.items()} == plain
    assert api.get(f"endpoints/{endpoints[1]['id']}/secret").json()["secret"] == endpoints[1]["secret"]


def test_without_the_keys_a_secret_cannot_be_read_and_nothing_is_sent_unsigned(api, settings):
    settings.HERALD_ENCRYPTION_KEYS = [_key()]
    create_endpoint(api, "https://a.example.com/")
    delivery_id = api.delivery_id("a.b")
    settings.HERALD_ENCRYPTION_KEYS = [_key()]  # the configured key was lost
    with pytest.raises(crypto.InvalidToken):
        EndpointSecret.objects.get().secret
    assert deliveries_claim(delivery_ids=[delivery_id]).claims == {}  # no claim to send without a signature


def test_a_rotation_with_a_key_that_opens_nothing_changes_nothing(api, settings):
    settings.HERALD_ENCRYPTION_KEYS = [_key()]
    create_endpoint(api, "https://a.example.com/")
    before = EndpointSecret.objects.get().encrypted_secret
    settings.HERALD_ENCRYPTION_KEYS = [_key()]
    with pytest.raises(Exception, match="no key in HERALD_ENCRYPTION_KEYS opens secret"):
        call_command("reencrypt_secrets", stdout=io.StringIO())
    assert EndpointSecret.objects.get().encrypted_secret == before


def test_the_migration_encrypts_the_plain_secrets_already_stored(api):
    endpoint = create_endpoint(api, "https://a.example.com/")
    executor = MigrationExecutor(connection)
    executor.migrate([("webhooks", "0010_event_body_stored_once")])  # back: the secret is plain text again
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM webhooks_endpointsecret")
        assert cursor.fetchone()[0] == endpoint["secret"]
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    stored = EndpointSecret.objects.get()
    assert "whsec_" not in stored.encrypted_secret and stored.secret == endpoint["secret"]


def test_the_demo_endpoint_follows_the_receivers_port(db, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    out = io.StringIO()
    call_command("demo_setup", "--receiver-url", "http://127.0.0.1:8081/webhooks", stdout=out)
    lines = dict(line.split("=", 1) for line in out.getvalue().split())
    assert lines["secret"].startswith("whsec_")
    call_command("demo_setup", "--receiver-url", "http://127.0.0.1:9090/webhooks", "--repoint", lines["endpoint"],
                 stdout=io.StringIO(), stderr=io.StringIO())
    from webhooks.models import Endpoint

    assert Endpoint.objects.get(pk=lines["endpoint"]).url == "http://127.0.0.1:9090/webhooks"
