"""The key's storage (intake/idempotency/store.py) against real PostgreSQL: one transaction per first
execution, the advisory-lock claim raced from a second real connection, and answers that carry a secret
encrypted at rest."""
import io
import threading
import time

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection, transaction

from intake.idempotency import store
from intake.models import IdempotencyKey
from tests.conftest import other_session, wait_until
from webhooks.models import Delivery, DeliveryOutbox, Event

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {"type": "invoice.paid", "data": {"invoice": "in_1"}}


def _xmin(table: str) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT xmin::text::bigint FROM {table}")
        return {row[0] for row in cursor.fetchall()}


def test_the_key_the_event_its_deliveries_outbox_rows_and_the_answer_commit_in_one_transaction(api):
    for url in ("https://a.example.com/", "https://b.example.com/"):
        api.post("endpoints", {"url": url})
    IdempotencyKey.objects.all().delete()  # keep only the event's key

    assert api.post("events", EVENT, key="one-transaction-1").status_code == 202

    # every row the request wrote carries the id of the transaction that wrote it: one for all of them
    assert Delivery.objects.count() == DeliveryOutbox.objects.count() == 2
    (xid,) = _xmin(IdempotencyKey._meta.db_table)
    assert _xmin(Event._meta.db_table) == _xmin(Delivery._meta.db_table) == _xmin(DeliveryOutbox._meta.db_table) \
        == {xid}


def test_a_4xx_is_stored_without_the_view_s_work(api):
    response = api.post("events", {"type": "not a type!", "data": {}}, key="four-hundred-1")
    assert response.status_code == 400
    assert IdempotencyKey.objects.get(key="four-hundred-1").response_status == 400
    assert not Event.objects.exists()


class Holder:
    """Another request holding a key, played by a second connection with the same advisory locks."""

    def __init__(self, key: store.Key):
        self._threads: list[threading.Thread] = []
        self.conn = other_session(autocommit=False)
        (key_a, key_b), (own_a, own_b) = key.locks
        self.conn.execute("SELECT pg_advisory_xact_lock(%s, %s), pg_advisory_xact_lock(%s, %s)",
                          [key_a, key_b, own_a, own_b])

        self._key_lock = (key_a, key_b)
        self.saw_a_waiter = False

    def store_and_commit_once_waited_on(self, key: store.Key) -> threading.Thread:
        def commit():
            self.conn.execute(
                "INSERT INTO intake_idempotencykey (credential_id, key, fingerprint, method, path, response_status, "
                "response_headers, response_body, response_encrypted, created_at, expires_at) VALUES "
                "(%s, %s, %s, 'POST', '/api/v1/events', 202, '[]', '\\x7b7d', false, now(), now() + interval '1 day')",
                [key.credential_id, key.key, key.fingerprint])
            self.conn.commit()
        return self._once_waited_on(commit)

    def release_once_waited_on(self) -> threading.Thread:
        return self._once_waited_on(self.conn.rollback)

    def release(self) -> None:
        self.conn.rollback()

    def _once_waited_on(self, action) -> threading.Thread:
        """Run `action` (let go) once PostgreSQL shows another session waiting for the key's lock: the claim
        is seen waiting, whatever the machine's load (no timer races the claim)."""
        def run():
            try:
                wait_until(self._waited_on, timeout=30, interval=0.002, message="a claim waiting for the key")
                self.saw_a_waiter = True
            finally:
                action()
        thread = threading.Thread(target=run)
        thread.start()
        self._threads.append(thread)
        return thread

    def _waited_on(self) -> bool:
        # on the holder's own connection (inside its transaction): pg_locks is read live, not from a snapshot
        return self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND NOT granted"
            " AND classid = (%s::int4)::oid AND objid = (%s::int4)::oid)", self._key_lock).fetchone()[0]

    def close(self):
        for thread in self._threads:  # an action still due runs first: never on a closed connection
            thread.join()
        self.conn.close()


@pytest.fixture
def key(api, monkeypatch):
    # a busy wait longer than any scheduling delay of a loaded machine: the holders below let go once they
    # see the claim waiting, so the claim never depends on how soon a thread runs
    monkeypatch.setattr(store, "BUSY_WAIT_MS", 30_000)
    return store.Key(credential_id=api.credential.id, key="claimed-key-0001", fingerprint="a" * 64)


def _claim(key):
    started = time.monotonic()
    with store.key_transaction():
        return store.key_claim(key), time.monotonic() - started


def test_a_claim_waits_briefly_for_a_holder_that_lets_go(key):
    holder = Holder(key)
    holder.release()  # a request that died or rolled back (5xx)
    try:
        claimed, _ = _claim(key)
        assert claimed is None  # no holder: held at once
    finally:
        holder.close()

    holder = Holder(key)
    try:
        holder.release_once_waited_on()
        claimed, _ = _claim(key)
    finally:
        holder.close()
    assert holder.saw_a_waiter and claimed is None  # waited for it (PostgreSQL showed it waiting), then held it


def test_a_claim_answers_from_the_row_a_holder_committed_while_it_waited(key):
    holder = Holder(key)
    try:
        holder.store_and_commit_once_waited_on(key)
        claimed, _ = _claim(key)
    finally:
        holder.close()
    assert holder.saw_a_waiter
    assert isinstance(claimed, store.Existing) and claimed.response_status == 202 and claimed.response_body == b"{}"


def test_a_claim_gives_up_after_the_busy_wait_and_tells_a_duplicate_from_a_mismatch(key, monkeypatch):
    monkeypatch.setattr(store, "BUSY_WAIT_MS", 25)  # the real wait: nobody lets go here
    holder = Holder(key)
    try:
        started = time.monotonic()
        with pytest.raises(store.KeyBusy):
            _claim(key)
        # at least the busy wait; the upper bound only says it gave up (a held key is held for 30 s here)
        assert store.BUSY_WAIT_MS / 1000 <= time.monotonic() - started < 10
        assert store.key_busy(key) == store.Busy(same_request=True)
        other = store.Key(credential_id=key.credential_id, key=key.key, fingerprint="b" * 64)
        assert store.key_busy(other) == store.Busy(same_request=False)
        holder.release()
        assert store.key_busy(key) is None  # nobody holds it now: the caller looks again
    finally:
        holder.close()


def test_the_busy_wait_leaves_lock_timeout_as_it_was(key, api):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        holder = Holder(key)
        try:
            holder.release_once_waited_on()
            assert store.key_claim(key) is None
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "7s"
        finally:
            holder.close()
    assert holder.saw_a_waiter


def _new_key() -> str:
    out = io.StringIO()
    call_command("reencrypt_secrets", "--new-key", stdout=out)
    return out.getvalue().strip()


def test_an_answer_that_carries_a_secret_is_stored_encrypted_and_replayed_byte_for_byte(api, settings):
    old, new = _new_key(), _new_key()
    settings.HERALD_ENCRYPTION_KEYS = [old]
    first = api.post("portal-links", key="portal-link-key-1")
    assert first.status_code == 201
    token = first.json()["url"].rstrip("/").rsplit("/", 1)[1]
    row = IdempotencyKey.objects.get(key="portal-link-key-1")
    assert row.response_encrypted and token.encode() not in bytes(row.response_body)
    assert Fernet(old).decrypt(bytes(row.response_body)) == first.content

    replay = api.post("portal-links", key="portal-link-key-1")
    assert replay["Idempotent-Replay"] == "true" and replay.content == first.content

    # rotation: re-encrypted under the new first key, the old one dropped, the replay unchanged
    settings.HERALD_ENCRYPTION_KEYS = [new, old]
    out = io.StringIO()
    call_command("reencrypt_secrets", stdout=out)
    assert "re-encrypted 1 stored idempotent answers" in out.getvalue()
    settings.HERALD_ENCRYPTION_KEYS = [new]
    assert Fernet(new).decrypt(bytes(IdempotencyKey.objects.get(key="portal-link-key-1").response_body)) \
        == first.content
    assert api.post("portal-links", key="portal-link-key-1").content == first.content


def test_answers_without_a_secret_are_stored_plain(api):
    response = api.post("events", EVENT, key="plain-answer-01")
    row = IdempotencyKey.objects.get(key="plain-answer-01")
    assert not row.response_encrypted and bytes(row.response_body) == response.content
