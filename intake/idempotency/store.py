"""PostgreSQL storage of idempotency keys: acquire in one statement, complete with fencing, release."""
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from intake.models import IdempotencyKey

_TABLE = IdempotencyKey._meta.db_table

# One round trip. The INSERT wins for a new key; ON CONFLICT … DO UPDATE … WHERE takes over an
# expired key, or a stale in_progress one with the same fingerprint, in a single conditional
# statement, so of several concurrent retries exactly one gets a row back. Everyone else reads
# the existing row in the same statement to decide between replay, mismatch and in progress.
_ACQUIRE_SQL = f"""
WITH acquired AS (
    INSERT INTO {_TABLE} AS k
        (credential_id, key, fingerprint, method, path, status, lock_token, locked_at, created_at, expires_at)
    VALUES (%(credential)s, %(key)s, %(fingerprint)s, %(method)s, %(path)s, 'in_progress', %(token)s,
            now(), now(), now() + make_interval(secs => %(retention)s))
    ON CONFLICT (credential_id, key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint, method = EXCLUDED.method, path = EXCLUDED.path,
        status = 'in_progress', lock_token = EXCLUDED.lock_token, locked_at = EXCLUDED.locked_at,
        created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
        response_status = NULL, response_headers = NULL, response_body = NULL
    WHERE k.expires_at <= now()
       OR (k.status = 'in_progress' AND k.fingerprint = EXCLUDED.fingerprint
           AND k.locked_at <= now() - make_interval(secs => %(lock_timeout)s))
    RETURNING k.id
)
SELECT id, true, NULL, NULL, NULL, NULL::jsonb, NULL::bytea, NULL::timestamptz FROM acquired
UNION ALL
SELECT id, false, fingerprint, status, response_status, response_headers, response_body, created_at
FROM {_TABLE}
WHERE credential_id = %(credential)s AND key = %(key)s AND NOT EXISTS (SELECT 1 FROM acquired)
"""


class LockLost(Exception):
    """The key was taken over while this request ran; its work must roll back."""


@dataclass(frozen=True)
class Acquired:
    id: int
    token: uuid.UUID


@dataclass(frozen=True)
class Existing:
    id: int
    fingerprint: str
    status: str
    response_status: int | None
    response_headers: list | None
    response_body: bytes | None
    created_at: datetime


def key_acquire(*, credential_id: int, key: str, fingerprint: str, method: str, path: str,
                retention_seconds: float, lock_timeout_seconds: float) -> Acquired | Existing:
    """Take the key for this request, or return the row that holds it (autocommit, one statement)."""
    token = uuid.uuid4()
    params = {
        "credential": credential_id, "key": key, "fingerprint": fingerprint, "method": method, "path": path,
        "token": token, "retention": retention_seconds, "lock_timeout": lock_timeout_seconds,
    }
    with connection.cursor() as cursor:
        # A row committed by a concurrent request after this statement's snapshot makes ON CONFLICT
        # skip, yet stays invisible to the SELECT half; the next statement's snapshot sees it.
        for _ in range(5):
            cursor.execute(_ACQUIRE_SQL, params)
            row = cursor.fetchone()
            if row is not None:
                break
        else:  # pragma: no cover - would need five consecutive races on one key
            raise RuntimeError("could not acquire or read the idempotency key")
    if row[1]:
        return Acquired(id=row[0], token=token)
    body, headers = row[6], row[5]
    if isinstance(headers, str):  # Django registers jsonb to load as text for raw cursors
        headers = json.loads(headers)
    return Existing(id=row[0], fingerprint=row[2], status=row[3], response_status=row[4],
                    response_headers=headers, response_body=bytes(body) if body is not None else None,
                    created_at=row[7])


_COMPLETE_SQL = f"""
UPDATE {_TABLE} SET status = 'completed', response_status = %s, response_headers = %s::jsonb, response_body = %s
 WHERE id = %s AND lock_token = %s AND status = 'in_progress'
"""


def key_complete(*, acquired: Acquired, status: int, headers: list[list[str]], body: bytes) -> None:
    """Store the response; raise LockLost if another request has taken the key over (fencing)."""
    with connection.cursor() as cursor:
        cursor.execute(_COMPLETE_SQL, [status, json.dumps(headers), body, acquired.id, acquired.token])
        if cursor.rowcount != 1:
            raise LockLost()


def key_release(*, acquired: Acquired) -> None:
    """Forget the key so that the client's retry executes afresh (after a 5xx or an exception)."""
    IdempotencyKey.objects.filter(id=acquired.id, lock_token=acquired.token).delete()
