"""Send webhooks from inside your own transaction (SPEC §13): a transactional outbox for Django.

    # settings.py
    INSTALLED_APPS += ["herald_client.django"]      # then: python manage.py migrate
    HERALD_API_URL, HERALD_TOKEN = "https://hooks.example.com", "hrld_…"   # or the environment

    # anywhere, inside your transaction
    from herald_client.django import publish
    with transaction.atomic():
        invoice.mark_paid()
        publish("invoice.paid", {"invoice": invoice.number})

`publish` writes one row to the outbox table in your database, in your transaction: a rollback sends
nothing, a commit is sent. `python manage.py herald_relay` (or the Celery task
`herald_client.django.tasks.relay_outbox` on your beat) sends committed rows to Herald, in order per
tenant, under Idempotency-Keys made from the rows, so a relay killed at any moment and started again
makes each row exactly one Herald event.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

_TYPE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
# The columns publish() writes; the others start NULL. One INSERT, made once per database: a model's save()
# costs several times the statement's own time in Python (measured by bench/outbox.py), and publish() runs
# inside the platform's own transactions.
_COLUMNS = ("key", "tenant", "type", "data", "channels", "created_at")  # and status, single, event_id: constants
_statements: dict[str, tuple[str, str, bool, list[Any]]] = {}


def publish(type: str, data: Any, *, tenant: str | None = None,  # noqa: A002 - Herald's name for it
            channels: list[str] | None = None, using: str | None = None) -> int:
    """Write one event for Herald to the outbox, in the caller's transaction (at once in autocommit), and
    return the row's id. `tenant` (a tenant's `tnt_…` id or your uid for it) needs a platform token;
    `using` a database alias other than the one the router picks for the outbox.

    A type that Herald would refuse whatever happens (not dot-separated `[A-Za-z0-9_]`, or `herald.…`) is a
    ValueError here, before anything is written, and so is `None` data or data that is not JSON. The row
    is written with one INSERT, without the model's save() (no model signals).
    """
    from django.db import connections, router
    from django.utils import timezone

    from herald_client.django.models import OutboxMessage

    if not isinstance(type, str) or not _TYPE.fullmatch(type) or type.startswith("herald."):
        raise ValueError(f"not an event type Herald accepts: {type!r} (dot-separated [A-Za-z0-9_], not herald.…)")
    if data is None:
        raise ValueError("data is required (any JSON value but null)")
    if channels is not None and (not isinstance(channels, list) or not all(isinstance(c, str) for c in channels)):
        raise ValueError("channels must be a list of strings")
    connection = connections[using or router.db_for_write(OutboxMessage)]
    statement = _statements.get(connection.alias)
    if statement is None or statement[0] != connection.vendor:
        statement = _statements[connection.alias] = _statement(connection, OutboxMessage)
    _, sql, returning, fields = statement
    try:  # here, not in the statement: a failed statement would abort the caller's transaction on PostgreSQL
        encoded = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data is not JSON: {exc}") from None
    key, created_at = (field.get_db_prep_save(value, connection) for field, value in
                       ((fields[0], uuid.uuid4()), (fields[5], timezone.now())))
    # JSON goes as its text, which every database takes for a JSON column (what the JSON field would send
    # on MySQL and SQLite; on PostgreSQL the column's type casts it), encoded once
    params = [key, tenant or "", type, encoded, json.dumps(channels or []), created_at]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0] if returning else cursor.lastrowid)


def _statement(connection: Any, model: Any) -> tuple[str, str, bool, list[Any]]:
    quote = connection.ops.quote_name
    returning = bool(connection.features.can_return_columns_from_insert)
    columns = ", ".join(quote(c) for c in (*_COLUMNS, "status", "single", "event_id"))
    sql = (f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
           f"VALUES ({', '.join(['%s'] * len(_COLUMNS))}, '{model.PENDING}', FALSE, '')"
           + (f" RETURNING {quote('id')}" if returning else ""))
    return connection.vendor, sql, returning, [model._meta.get_field(name) for name in _COLUMNS]


__all__ = ["publish"]
