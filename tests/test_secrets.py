"""Endpoint secrets at rest: encrypted, rotated under new keys, migrated, and never sent unsigned."""
import io
import subprocess
import sys

import psycopg
import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection

from tests.conftest import create_endpoint, subprocess_env
from webhooks import crypto
from webhooks.models import EndpointSecret
from webhooks.delivery.claim import deliveries_claim

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


def test_the_migration_encrypts_the_plain_secrets_already_stored(db):
    """0011 on a database of its own that holds a plain secret: the test database is not migrated back and
    forth (a later migration need not be reversible)."""
    params = connection.settings_dict
    name = f"{params['NAME']}_secrets"
    server = (f"host={params.get('HOST') or '127.0.0.1'} port={params.get('PORT') or 5432} "
              f"user={params.get('USER') or 'root'}")
    with psycopg.connect(server + " dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    env = subprocess_env()
    env["DATABASE_URL"] = env["DATABASE_URL"].rsplit("/", 1)[0] + "/" + name

    def migrate(target: str) -> None:
        done = subprocess.run([sys.executable, "manage.py", "migrate", "webhooks", target, "-v0"], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    secret = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"
    try:
        migrate("0010")
        with psycopg.connect(server + f" dbname={name}", autocommit=True) as conn:
            conn.execute("INSERT INTO webhooks_tenant (id, name, created_at) VALUES ('tnt_1', 't', now())")
            conn.execute("""INSERT INTO webhooks_endpoint (id, tenant_id, url, description, event_types, channels,
                                enabled, disabled_reason, consecutive_failures, failed_probes, ordering, created_at,
                                updated_at)
                            VALUES ('ep_1', 'tnt_1', 'https://a.example.com/', '', '{}', '{}', true, '', 0, 0,
                                    'unordered', now(), now())""")
            conn.execute("INSERT INTO webhooks_endpointsecret (secret, endpoint_id, created_at) "
                         "VALUES (%s, 'ep_1', now())", [secret])
        migrate("0011")
        with psycopg.connect(server + f" dbname={name}", autocommit=True) as conn:
            (stored,) = conn.execute("SELECT secret FROM webhooks_endpointsecret").fetchone()
        assert "whsec_" not in stored and crypto.decrypt(stored) == secret
    finally:
        with psycopg.connect(server + " dbname=postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


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
