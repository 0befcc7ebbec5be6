"""The delivery core's way to PostgreSQL: a claim or a record as a statement of its own, on the worker's pool.

Also the one place the deployment's default cap (WEBHOOK_ENDPOINT_MAX_IN_FLIGHT) goes into SQL: every
statement that asks an endpoint's cap (`herald_endpoint_cap`, through the claim, the record or the
hand-on: webhooks/sql/) takes its params from `endpoint_params`.
"""
import contextlib

import psycopg
from django.db import connection

from webhooks.conf import herald_settings


def endpoint_params(**params) -> dict:
    """Params for a statement that asks `herald_endpoint_cap`: `default_cap` is the deployment's default."""
    return {**params, "default_cap": herald_settings.delivery.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT}


def call(sql: str, params: dict) -> list[tuple]:
    """Run one statement (a claim or record function) as its own transaction; return its rows.

    In a threaded worker the connection comes straight from its psycopg pool, without Django's
    per-checkout bookkeeping; a connection found broken (PostgreSQL restarted) is dropped and the
    call made once more on a fresh one. The functions are safe to repeat: one that did commit finds
    nothing left to do the second time.
    """
    return _run(sql, params, None)[0]


def call_then(sql: str, params: dict, then) -> tuple[list[tuple], object]:
    """As `call`, and then `then(cursor, rows)` in the same transaction (a record that claims the deliveries its
    freed slots went to, before any other claim can take those slots); returns (rows, what `then` returned)."""
    return _run(sql, params, then)


def _run(sql: str, params: dict, then) -> tuple[list[tuple], object]:
    if connection.in_atomic_block:
        raise RuntimeError("a delivery is claimed and recorded in transactions of its own, not inside another")
    for attempt in (1, 2):
        with raw_connection() as raw:
            try:
                if then is None:  # one statement: its own transaction, no BEGIN and COMMIT round trips
                    with raw.cursor() as cursor:
                        cursor.execute(sql, params)
                        return cursor.fetchall(), None
                with raw.transaction(), raw.cursor() as cursor:
                    cursor.execute(sql, params)
                    rows = cursor.fetchall()
                    return rows, then(cursor, rows)
            except psycopg.OperationalError:
                if attempt == 2 or not raw.closed:
                    raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def raw_connection():
    pool = connection.pool  # the worker's psycopg pool (config/celery.py), or None
    if pool is None:
        connection.ensure_connection()
        with connection.wrap_database_errors:
            yield connection.connection
        return
    pool.open()  # a no-op once open
    raw = pool.getconn()
    try:
        yield raw
    finally:
        pool.putconn(raw)  # a broken connection is discarded and replaced by the pool
