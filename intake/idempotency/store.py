"""PostgreSQL storage of idempotency keys: read, claim, store (SPEC §3).

A key row exists only once the request that first used it has committed: the row is written by the
last statement of the request's own transaction, with the answer, so the key, the work and the
stored answer commit together. While a request runs, the key is held by a transaction-scoped
advisory lock, not by a row: it ends with the transaction whatever happens (commit, rollback, the
process killed), so nothing is ever left `in_progress` for a retry to wait out.

A key is the credential's, and when the platform acts for a tenant (/api/v1/tenants/{tenant}/…) that
tenant's too: its scope is (credential, tenant, key), the tenant NULL for every other call (SPEC §10).

Two advisory locks per running request, both in PostgreSQL's two-int4 key space (which nothing else
of Herald's uses; beat's lock is a single int8) and both taken by one statement:
  - the key's own (credential, tenant, key): of several requests with one key exactly one gets it;
  - (credential, tenant, key, fingerprint): its only use is to let a concurrent request with the same key
    tell a duplicate of the running request (409 in progress) from a different request reusing the
    key (mismatch) before any row exists (the fingerprint is compared first, SPEC §3).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, OperationalError, connection, transaction

from intake.models import ApiCredential, IdempotencyKey
from webhooks.models import Tenant
from webhooks import crypto

_TABLE = IdempotencyKey._meta.db_table
# The request's credential may come from its process's cache (intake/credentials.py), so the read and
# the claim each ask again, in the same statement, that it is live: a revoked token gets no replay and
# executes nothing, in every process, from the moment its revocation commits.
# A credential of a deleted tenant is not live either (its deletion revoked it; asked again all the same).
_LIVE = (f"EXISTS (SELECT 1 FROM {ApiCredential._meta.db_table} c LEFT JOIN {Tenant._meta.db_table} t ON t.id = c.tenant_id"
         " WHERE c.id = %s AND c.revoked_at IS NULL AND t.deleted_at IS NULL)")

# How long a request whose key another request holds waits for it before answering 409: a holder that
# finishes meanwhile (most take a few milliseconds) is answered by its replay, and one whose process
# died (PostgreSQL notices within the web connections' client_connection_check_interval) lets the
# retry execute.
BUSY_WAIT_MS = 25

# A replay, a mismatch: one read, outside any transaction (no BEGIN, no COMMIT, no lock, no WAL). An
# expired row is read too, only so that the request's store knows to replace it (it is treated as new).
# Two forms, one per partial unique index (intake/models.py): without a tenant, and with one.
_READ_SQL = f"""
SELECT fingerprint, response_status, response_headers, response_body, response_encrypted, created_at,
       expires_at <= now()
  FROM {_TABLE} WHERE credential_id = %s AND key = %s AND {{tenant}} AND {_LIVE}
"""
_NO_TENANT = "tenant_id IS NULL"
_TENANT = "tenant_id = %s"
_READ_SQL_NO_TENANT = _READ_SQL.format(tenant=_NO_TENANT)
_READ_SQL_TENANT = _READ_SQL.format(tenant=_TENANT)
# The first statement of the request's transaction. CASE fixes the order: the fingerprint's lock is
# taken only by the key's holder, and no lock by a revoked credential (NULL).
_CLAIM_SQL = f"""
SELECT CASE WHEN NOT {_LIVE} THEN NULL
            WHEN pg_try_advisory_xact_lock(%s, %s) THEN pg_try_advisory_xact_lock(%s, %s) IS NOT NULL
            ELSE false END
"""
# The key is busy: wait up to BUSY_WAIT_MS for it (lock_timeout, set for this statement's wait only).
_WAIT_SQL = """
SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true), pg_advisory_xact_lock(%s, %s)
"""
_AFTER_WAIT_SQL = "SELECT set_config('lock_timeout', %s, true), pg_try_advisory_xact_lock(%s, %s)"
# Whether a lock of the two-int4 space is held by another session (advisory locks are per database).
_HELD_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_locks
                WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND pid <> pg_backend_pid()
                  AND classid = (%s::int4)::oid AND objid = (%s::int4)::oid
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
"""
# The last statement of the request's transaction, sent with its COMMIT in one round trip (one query
# string, PostgreSQL's simple protocol: a statement that fails skips the rest, COMMIT included). A live
# row under the key means another request stored it after our read (it committed between our read and
# our lock): the INSERT fails on the unique index and the transaction rolls back. An expired one (the
# read saw it) is deleted first: an expired key is treated as new.
_DELETE_EXPIRED_SQL = (f"DELETE FROM {_TABLE} WHERE credential_id = %(credential)s AND key = %(key)s"
                       " AND {tenant} AND expires_at <= now();")
_DELETE_EXPIRED_SQL_NO_TENANT = _DELETE_EXPIRED_SQL.format(tenant=_NO_TENANT)
_DELETE_EXPIRED_SQL_TENANT = _DELETE_EXPIRED_SQL.format(tenant="tenant_id = %(tenant)s")
_INSERT_SQL = f"""
INSERT INTO {_TABLE} (credential_id, tenant_id, key, fingerprint, method, path, response_status, response_headers,
                      response_body, response_encrypted, created_at, expires_at)
VALUES (%(credential)s, %(tenant)s, %(key)s, %(fingerprint)s, %(method)s, %(path)s, %(status)s,
        %(headers)s::jsonb, %(body)s, %(encrypted)s, now(), now() + make_interval(secs => %(retention)s));
"""


class KeyBusy(Exception):
    """Another request holds the key after BUSY_WAIT_MS; the transaction is aborted, roll it back."""


class KeyTaken(Exception):
    """Another request stored this key first; roll the work back and answer from its row."""


class CredentialRevoked(Exception):
    """The request's credential was revoked since its process looked it up; roll back, answer 401."""


@dataclass(frozen=True)
class Existing:
    fingerprint: str
    response_status: int
    response_headers: list
    response_body: bytes
    created_at: datetime
    expired: bool = False  # past the retention: the key is new, and its store replaces this row


@dataclass(frozen=True)
class Busy:
    """Another request with this key is running: with this request's fingerprint, or another one."""

    same_request: bool


@dataclass(frozen=True)
class Key:
    """One key of one credential (for one tenant, when the platform acts for one) and the fingerprint of
    the request presenting it, with its lock ids."""

    credential_id: int
    key: str
    fingerprint: str
    tenant_id: str | None = None

    @property
    def locks(self) -> tuple[tuple[int, int], tuple[int, int]]:
        scope = f"{self.credential_id}\n{self.key}" if self.tenant_id is None else \
            f"{self.credential_id}\n{self.tenant_id}\n{self.key}"
        digest = hashlib.blake2b(scope.encode(), digest_size=8)
        own = digest.copy()
        own.update(b"\n" + self.fingerprint.encode())
        return _int4_pair(digest.digest()), _int4_pair(own.digest())


def _int4_pair(raw: bytes) -> tuple[int, int]:
    return int.from_bytes(raw[:4], "big", signed=True), int.from_bytes(raw[4:], "big", signed=True)


def key_read(key: Key) -> Existing | None:
    """The stored answer for this key (`expired`: past retention, the key is new), or None."""
    with connection.cursor() as cursor:
        if key.tenant_id is None:
            cursor.execute(_READ_SQL_NO_TENANT, [key.credential_id, key.key, key.credential_id])
        else:
            cursor.execute(_READ_SQL_TENANT, [key.credential_id, key.key, key.tenant_id, key.credential_id])
        row = cursor.fetchone()
    if row is None:
        return None
    fingerprint, status, headers, body, encrypted, created_at, expired = row
    if expired:
        return Existing(fingerprint=fingerprint, response_status=status, response_headers=[], response_body=b"",
                        created_at=created_at, expired=True)
    return existing_from_row(fingerprint, status, headers, body, encrypted, created_at)


def existing_from_row(fingerprint: str, status: int, headers, body, encrypted: bool, created_at: datetime) -> Existing:
    """A live stored answer from its row's columns (the read's, or intake/idempotency/fast_events.py's statement's)."""
    if isinstance(headers, str):  # Django registers jsonb to load as text for raw cursors
        headers = json.loads(headers)
    body = bytes(body)
    return Existing(fingerprint=fingerprint, response_status=status, response_headers=headers,
                    response_body=crypto.decrypt_bytes(body) if encrypted else body, created_at=created_at)


def _live(existing: Existing | None) -> Existing | None:
    return None if existing is None or existing.expired else existing


def key_transaction():
    """The request's transaction: transaction.atomic(), whose BEGIN Herald's database backend lets the
    first statement (key_claim's) carry, one round trip fewer (config/db/base.py)."""
    begun = getattr(connection, "atomic_begun_by_first_statement", None)
    return begun() if begun is not None else transaction.atomic()


def key_claim(key: Key) -> Existing | None:
    """Hold the key for the rest of the caller's transaction: the first statement in `key_transaction()`.

    None: held, execute. Existing: the request holding it finished while this one waited; answer from
    its row. KeyBusy: still held by another request after BUSY_WAIT_MS (the transaction is aborted).
    CredentialRevoked: nothing is held.
    """
    (key_a, key_b), (own_a, own_b) = key.locks
    begin = connection.take_begin() if hasattr(connection, "take_begin") else ""
    with connection.cursor() as cursor:
        cursor.execute(begin + _CLAIM_SQL, [key.credential_id, key_a, key_b, own_a, own_b])
        if begin:
            cursor.nextset()  # past BEGIN's result, to the claim's
        held = cursor.fetchone()[0]
        if held is None:
            raise CredentialRevoked()
        if held:
            return None
        try:
            cursor.execute(_WAIT_SQL, [f"{BUSY_WAIT_MS}ms", key_a, key_b])
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available: lock_timeout
                raise KeyBusy() from None
            raise
        previous = cursor.fetchone()[0]
        cursor.execute(_AFTER_WAIT_SQL, [previous, own_a, own_b])
    # A new statement, so a new snapshot: it sees what the holder committed before letting go.
    return _live(key_read(key))


def key_busy(key: Key) -> Busy | Existing | None:
    """After KeyBusy (outside the aborted transaction): who holds the key. None: nobody any more (look again)."""
    (key_a, key_b), (own_a, own_b) = key.locks
    with connection.cursor() as cursor:
        cursor.execute(_HELD_SQL, [own_a, own_b])
        if cursor.fetchone()[0]:
            return Busy(same_request=True)
    # Each statement below sees what committed before it: a holder commits before its locks go.
    existing = _live(key_read(key))
    if existing is not None:
        return existing
    with connection.cursor() as cursor:
        cursor.execute(_HELD_SQL, [key_a, key_b])
        if cursor.fetchone()[0]:
            return Busy(same_request=False)
    return None


def key_store(key: Key, *, method: str, path: str, status: int, headers: list[list[str]], body: bytes,
              encrypt: bool, retention_seconds: float, replace_expired: bool, commit: bool) -> None:
    """Store the answer under the key: as the last statement of the request's transaction, with its
    COMMIT (`commit`), or alone after a 4xx's rollback. KeyTaken if another request stored it first
    (the transaction is then aborted: roll it back). `replace_expired`: the read saw an expired row."""
    delete_expired = _DELETE_EXPIRED_SQL_NO_TENANT if key.tenant_id is None else _DELETE_EXPIRED_SQL_TENANT
    sql = (delete_expired if replace_expired else "") + _INSERT_SQL + ("COMMIT;" if commit else "")
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, {
                "credential": key.credential_id, "tenant": key.tenant_id, "key": key.key, "fingerprint": key.fingerprint, "method": method,
                "path": path, "status": status, "headers": json.dumps(headers),
                "body": crypto.encrypt_bytes(body) if encrypt else body, "encrypted": encrypt,
                "retention": retention_seconds,
            })
    except IntegrityError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "23505":  # unique_violation: (credential, tenant, key)
            raise KeyTaken() from None
        raise


_REENCRYPT_SQL = f"""
SELECT id, response_body FROM {_TABLE} WHERE response_encrypted AND id > %s ORDER BY id LIMIT %s FOR UPDATE
"""


def keys_reencrypt(*, batch_size: int) -> int:
    """Re-encrypt every encrypted stored answer under the first HERALD_ENCRYPTION_KEYS key, batch by
    batch (each its own transaction); the number re-encrypted. crypto.InvalidToken if no key opens one."""
    done = last = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_REENCRYPT_SQL, [last, batch_size])
            rows = cursor.fetchall()
            if rows:
                cursor.executemany(f"UPDATE {_TABLE} SET response_body = %s WHERE id = %s",
                                   [(crypto.reencrypt_bytes(bytes(body)), row_id) for row_id, body in rows])
        done += len(rows)
        if len(rows) < batch_size:
            return done
        last = rows[-1][0]
