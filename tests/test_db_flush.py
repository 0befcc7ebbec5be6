"""The suite's own harness: a transactional test's teardown survives a deadlock with a process still writing
(tests/conftest.py `_flush_retried_on_deadlock`), made here for real with two PostgreSQL sessions."""
import re
import threading

import psycopg
import pytest
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection
from django.test import TransactionTestCase

from intake.credentials import credential_create
from tests.conftest import wait_until
from webhooks.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _conninfo() -> str:
    settings = connection.settings_dict
    return psycopg.conninfo.make_conninfo(dbname=settings["NAME"], host=settings["HOST"] or None,
                                          port=settings["PORT"] or None, user=settings["USER"] or None)


def test_a_flush_aborted_by_a_deadlock_with_a_writer_is_tried_again():
    credential_create(tenant_name="flushed")  # rows for the flush to empty
    (truncate,) = sql_flush(no_style(), connection, connection.introspection.django_table_names(
        only_existing=True, include_views=False))
    tables = re.match(r"TRUNCATE (.+?)( RESTART IDENTITY)?( CASCADE)?;$", truncate).group(1).split(", ")
    first, last = tables[0], tables[-1]
    flush_pid = connection.cursor().connection.info.backend_pid
    outcome = {}

    def writer():
        # holds the TRUNCATE's last table, then asks for its first one once the TRUNCATE waits: a deadlock
        with psycopg.connect(_conninfo()) as other, psycopg.connect(_conninfo(), autocommit=True) as look:
            other.execute(f"LOCK TABLE {last} IN ROW EXCLUSIVE MODE")
            ready.set()

            def flush_waits():
                row = look.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                   (flush_pid,)).fetchone()
                return row and row[0] == "Lock"

            wait_until(flush_waits, timeout=20, message="the flush waiting on the writer's table")
            try:
                other.execute(f"LOCK TABLE {first} IN ROW EXCLUSIVE MODE")
                other.commit()
                outcome["writer"] = "committed"
            except psycopg.errors.DeadlockDetected:
                outcome["writer"] = "aborted"

    ready = threading.Event()
    thread = threading.Thread(target=writer)
    thread.start()
    assert ready.wait(20)
    TransactionTestCase()._fixture_teardown()  # the teardown every transactional test runs
    thread.join(30)
    assert outcome.get("writer") in ("committed", "aborted")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {Tenant._meta.db_table}")
        assert cursor.fetchone()[0] == 0
