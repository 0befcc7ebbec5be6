"""PostgreSQL storage of idempotency keys: read or acquire, complete with fencing, release."""
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from intake.models import IdempotencyKey

_TABLE = IdempotencyKey._meta.db_table

# A replay is a plain read: the INSERT below inserts nothing when the row exists, so it takes no row
# lock, no transaction id and writes no WAL, and replays of one key never queue behind each other or
# behind the request completing it. A new key is inserted in the same round trip; of several
# concurrent first requests exactly one gets `acquired`. The row read is live unless it has expired,
# or it is a stale in_progress one (its request died) that this same request may take over.
_ACQUIRE_SQL = f"""
WITH existing AS (
    SELECT id, fingerprint, status, response_status, response_headers, response_body, created_at,
           expires_at <= now()
           OR (status = 'in_progress' AND fingerprint = %(fingerprint)s
               AND locked_at <= now() - make_interval(secs => %(lock_timeout)s)) AS takeover
      FROM {_TABLE}
     WHERE credential_id = %(credential)s AND key = %(key)s
), acquired AS (
    INSERT INTO {_TABLE}
        (credential_id, key, fingerprint, method, path, status, lock_token, locked_at, created_at, expires_at)
    SELECT %(credential)s, %(key)s, %(fingerprint)s, %(method)s, %(path)s, 'in_progress', %(token)s,
           now(), now(), now() + make_interval(secs => %(retention)s)
     WHERE NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (credential_id, key) DO NOTHING
    RETURNING id
)
SELECT id, true, NULL, NULL, NULL::smallint, NULL::jsonb, NULL::bytea, NULL::timestamptz, false FROM acquired
UNION ALL
SELECT id, false, fingerprint, status, response_status, response_headers, response_body, created_at, takeover
  FROM existing
"""
# An expired or stale key is taken over by one conditional UPDATE, which re-checks the condition on
# the row's latest version: of several requests taking over the same row, exactly one wins.
_TAKEOVER_SQL = f"""
UPDATE {_TABLE} SET
    fingerprint = %(fingerprint)s, method = %(method)s, path = %(path)s, status = 'in_progress',
    lock_token = %(token)s, locked_at = now(), created_at = now(),
    expires_at = now() + make_interval(secs => %(retention)s),
    response_status = NULL, response_headers = NULL, response_body = NULL
 WHERE id = %(id)s
   AND (expires_at <= now()
        OR (status = 'in_progress' AND fingerprint = %(fingerprint)s
            AND locked_at <= now() - make_interval(secs => %(lock_timeout)s)))
RETURNING id
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
    """Take the key for this request, or return the row that holds it (autocommit statements).

    One statement reads the key and, on a miss, inserts it; an expired or stale row is then taken
    over by a conditional UPDATE. Losing a race means another request changed the row since the
    read: read again (each statement sees what committed before it).
    """
    token = uuid.uuid4()
    params = {
        "credential": credential_id, "key": key, "fingerprint": fingerprint, "method": method, "path": path,
        "token": token, "retention": retention_seconds, "lock_timeout": lock_timeout_seconds,
    }
    with connection.cursor() as cursor:
        for _ in range(5):
            cursor.execute(_ACQUIRE_SQL, params)
            row = cursor.fetchone()
            if row is None:
                # A concurrent request inserted the key after this statement's snapshot was taken:
                # the INSERT skipped it and the read could not see it; the next statement will.
                continue
            if row[1]:
                return Acquired(id=row[0], token=token)
            if not row[8]:
                return _existing(row[:1] + row[2:8])
            cursor.execute(_TAKEOVER_SQL, {**params, "id": row[0]})
            won = cursor.fetchone()
            if won is not None:
                return Acquired(id=won[0], token=token)
    raise RuntimeError("could not acquire or read the idempotency key")  # five lost races in a row


def _existing(row: tuple) -> Existing:
    body, headers = row[5], row[4]
    if isinstance(headers, str):  # Django registers jsonb to load as text for raw cursors
        headers = json.loads(headers)
    return Existing(id=row[0], fingerprint=row[1], status=row[2], response_status=row[3],
                    response_headers=headers, response_body=bytes(body) if body is not None else None,
                    created_at=row[6])


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
