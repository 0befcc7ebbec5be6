"""The PostgreSQL functions are the files in webhooks/sql/: what a migrated database runs is what they say."""
import pytest
from django.core.management import call_command
from django.db import connection

from webhooks import sql


@pytest.mark.django_db
def test_every_installed_function_is_its_file():
    installed = sql.installed_bodies(connection)
    assert sorted(installed) == sorted(sql.function_name(path) for path in sql.files())
    for path in sql.files():
        assert installed[sql.function_name(path)] == sql.body(sql.text(path)), path.name
    assert sql.differences(connection) == []


@pytest.mark.django_db(transaction=True)
def test_a_changed_function_is_put_back_by_the_next_migrate():
    """What a hand-edited or stale function becomes after `manage.py migrate`, with nothing to migrate."""
    name = sql.function_name(sql.FOLDER / "delivery_count_add.sql")
    with connection.cursor() as cursor:
        cursor.execute(f"""CREATE OR REPLACE FUNCTION {name}(p_pending bigint, p_failed bigint) RETURNS void
                           LANGUAGE plpgsql AS $fn$ BEGIN RETURN; END $fn$""")
    assert sql.differences(connection) == [name]
    call_command("migrate", verbosity=0)
    assert sql.differences(connection) == []


@pytest.mark.django_db(transaction=True)
def test_a_function_whose_settings_changed_is_put_back_too():
    """The claim's `SET plan_cache_mode` (a cached plan on the partitioned tables) is part of what its file says."""
    path = sql.FOLDER / "delivery_claim.sql"
    name = sql.function_name(path)
    assert sql.settings(sql.text(path)) == ["plan_cache_mode=force_generic_plan"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid::regprocedure::text FROM pg_proc WHERE proname = %s", [name])
        (signature,) = cursor.fetchone()
        cursor.execute(f"ALTER FUNCTION {signature} RESET ALL")
    assert sql.differences(connection) == [name]
    call_command("migrate", verbosity=0)
    assert sql.differences(connection) == []
    assert sql.installed_settings(connection)[name] == ["plan_cache_mode=force_generic_plan"]


def test_each_function_is_in_one_file_and_no_migration_holds_a_body():
    """No second current copy: the migrations install the files instead of carrying the SQL."""
    names = [sql.function_name(path) for path in sql.files()]
    assert len(names) == len(set(names))
    migrations = sql.FOLDER.parent / "migrations"
    for migration in migrations.glob("0*.py"):
        assert "CREATE OR REPLACE FUNCTION" not in migration.read_text(), migration.name


@pytest.mark.django_db
def test_the_breakers_healthy_is_the_same_rule_as_the_sql_function():
    """`healthy` is said twice, on purpose: in SQL for the claim and the record's fast path
    (herald_endpoint_healthy), in the pure breaker for the slow path. They agree on every combination."""
    from datetime import datetime, timezone
    from itertools import product

    from webhooks.delivery.breaker import BreakerState

    then = datetime(2026, 12, 1, tzinfo=timezone.utc)
    cases = list(product((None, then), (0, 1, 5), (None, then)))
    with connection.cursor() as cursor:
        for tripped_at, failures, failing_since in cases:
            cursor.execute("SELECT herald_endpoint_healthy(%s, %s, %s)", [tripped_at, failures, failing_since])
            in_sql = cursor.fetchone()[0]
            in_python = BreakerState(failures, tripped_at, 0, failing_since).healthy
            assert in_sql is in_python, (tripped_at, failures, failing_since)
    assert sum(BreakerState(f, t, 0, s).healthy for t, f, s in cases) == 1  # only the one with nothing set


@pytest.mark.django_db
def test_the_fast_paths_fan_out_is_the_fan_out_modules_own():
    """herald_event_intake (event_intake.sql) holds no copy of the matching rule or of the delivery and outbox
    inserts: its file has a placeholder, and what is installed is webhooks/delivery/fanout.py's statement."""
    from webhooks.delivery import fanout

    path = sql.FOLDER / "event_intake.sql"
    assert "{{single_event}}" in path.read_text() and "INSERT INTO webhooks_delivery" not in path.read_text()
    installed = sql.installed_bodies(connection)[sql.function_name(path)]
    assert fanout.FAST_PATH_FANOUT in installed and "{{" not in installed
    assert all("{{" not in sql.text(each) for each in sql.files())
