"""Prune expired idempotency keys in batches, so no single DELETE holds locks for long."""
from django.db import connection

from intake.models import IdempotencyKey

_TABLE = IdempotencyKey._meta.db_table
_PRUNE_SQL = f"""
DELETE FROM {_TABLE} WHERE id IN (
    SELECT id FROM {_TABLE} WHERE expires_at <= now() ORDER BY expires_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
"""


def keys_prune_expired(*, batch_size: int, max_batches: int | None = None) -> tuple[int, int]:
    """Delete expired keys batch by batch (each its own transaction); return (rows, batches)."""
    total = batches = 0
    while max_batches is None or batches < max_batches:
        with connection.cursor() as cursor:
            cursor.execute(_PRUNE_SQL, {"batch": batch_size})
            deleted = cursor.rowcount
        batches += 1
        total += deleted
        if deleted < batch_size:
            break
    return total, batches
