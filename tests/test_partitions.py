"""History in partitions (webhooks/services/partitions.py), against real PostgreSQL: where rows land, the days
made ahead, a day past retention dropped whole with its pending events moved on, a busy moment, the counts, and
migration 0028 converting tables that hold rows."""
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from django.db import connection, transaction

from tests.conftest import create_endpoint, other_session, subprocess_env
from webhooks import ids
from webhooks.delivery.engine import delivery_attempt
from webhooks.models import (Delivery, DeliveryAttempt, DeliveryCount, DeliveryLease, DeliveryOutbox, Event,
                             Tenant)
from webhooks.services import partitions
from webhooks.services.retention import events_prune

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("days_restored")]


def _where(table: str, column: str, value: str) -> str:
    """The partition holding the row."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s", [value])
        return cursor.fetchone()[0]


def _counted() -> tuple[int, int]:
    return tuple(sum(getattr(shard, field) for shard in DeliveryCount.objects.all()) for field in ("pending", "failed"))


def _actual() -> tuple[int, int]:
    return (Delivery.objects.filter(status=Delivery.PENDING).count(),
            Delivery.objects.filter(status=Delivery.FAILED).count())


def history(tenant: Tenant, endpoint_ids: list[str], when: datetime, statuses: list[str]) -> list[str]:
    """Events made at `when` (their ids as intake would have made them then), one per status, each with a
    delivery to every endpoint in that status and one attempt each; a pending one has its outbox row. The ids."""
    made = []
    for status in statuses:
        event = Event.objects.create(id=ids.made_at("evt", when), tenant=tenant, type="invoice.paid",
                                     payload=b'{"type":"invoice.paid","timestamp":"x","data":{}}', created_at=when)
        for rank, endpoint_id in enumerate(endpoint_ids, 1):
            delivery = Delivery.objects.create(
                id=f"dlv_{event.id.removeprefix('evt_')}{rank:05}", tenant=tenant, event=event,
                endpoint_id=endpoint_id, status=status, attempt_count=1,
                next_attempt_at=when + timedelta(days=400) if status == Delivery.PENDING else None)
            Delivery.objects.filter(pk=delivery.pk).update(created_at=when)
            DeliveryAttempt.objects.create(delivery=delivery, number=1, started_at=when, duration_ms=3,
                                           response_status=500 if status != Delivery.SUCCEEDED else 200)
            if status == Delivery.PENDING:
                DeliveryOutbox.objects.create(delivery=delivery, due_at=delivery.next_attempt_at, tenant=tenant)
        made.append(event.id)
    return made


def test_a_new_database_has_partitions_from_yesterday_to_the_days_ahead_and_a_default_for_the_rest():
    today = partitions.today()
    spans = partitions.spans()
    assert spans[0].first <= today - timedelta(days=1) and spans[-1].end > today + timedelta(days=partitions.DAYS_AHEAD)
    assert all(a.end == b.first for a, b in zip(spans, spans[1:]))  # no gap
    assert {(span.end - span.first).days for span in spans} == {partitions.span_days()}
    assert spans[0].first.weekday() == 0  # weeks from a Monday
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname LIKE 'webhooks_%%_default'")
        assert {row[0] for row in cursor.fetchall()} >= {partitions.default_name(p.table) for p in partitions.TABLES}


def test_an_event_its_deliveries_and_their_attempts_land_in_the_day_they_were_made(api, receiver):
    create_endpoint(api, receiver.url("/a"))
    create_endpoint(api, receiver.url("/b"))
    event = api.send_event("invoice.paid", {"n": 1})
    first = event["deliveries"][0]["id"]
    assert delivery_attempt(delivery_id=first) == Delivery.SUCCEEDED
    span = partitions.covering(ids.time_of(event["id"]).date())
    assert _where("webhooks_event", "id", event["id"]) == partitions.name("webhooks_event", span)
    assert {_where("webhooks_delivery", "id", d["id"]) for d in event["deliveries"]} == {
        partitions.name("webhooks_delivery", span)}
    assert _where("webhooks_deliveryattempt", "delivery_id", first) == partitions.name("webhooks_deliveryattempt", span)


def test_ensure_makes_the_missing_partitions_without_gaps_and_leaves_a_span_whose_rows_went_to_the_default(api):
    newest = partitions.spans()[-1]
    noon = newest.stop() + timedelta(days=partitions.span_days() + 1, hours=12)  # in the span after the next
    endpoint = create_endpoint(api, "https://a.example.com/")
    (early,) = history(api.tenant, [endpoint["id"]], noon, [Delivery.SUCCEEDED])  # no partition for it yet
    assert _where("webhooks_event", "id", early) == "webhooks_event_default"
    days = partitions.span_days()
    nxt, taken, after = (partitions.Span(newest.end + timedelta(days=days * n), newest.end + timedelta(days=days * (n + 1)))
                         for n in range(3))

    made = partitions.ensure(last=after.first)

    # the next span is made, the one holding the row is left to the default partition, the one after is made
    assert made == [partitions.name(p.table, span) for span in (nxt, after) for p in partitions.TABLES]
    assert _where("webhooks_event", "id", early) == "webhooks_event_default"  # where it was, still found
    assert taken not in partitions.spans() and {nxt, after} <= set(partitions.spans())
    assert partitions.ensure(last=after.first) == []  # nothing more to make, and the gap is not tried again


def test_partitions_for_older_history_are_made_backwards_from_the_oldest():
    oldest = partitions.spans()[0]
    day = oldest.first - timedelta(days=3 * partitions.span_days())
    made = partitions.ensure(first=day, last=day)
    assert len(made) == 3 * len(partitions.TABLES)
    assert partitions.covering(day) == partitions.Span(day, oldest.first - timedelta(days=2 * partitions.span_days()))
    earlier = [span for span in partitions.spans() if span.first < oldest.first]
    assert earlier[-1].end == oldest.first and all(a.end == b.first for a, b in zip(earlier, earlier[1:]))


def test_a_day_past_retention_goes_whole_and_its_pending_events_move_on_to_the_default_partition(api, receiver):
    old_day = partitions.today() - timedelta(days=40)
    partitions.ensure(first=old_day)
    a, b = (create_endpoint(api, receiver.url(f"/{n}"))["id"] for n in "ab")
    when = datetime.combine(old_day, datetime.min.time(), tzinfo=timezone.utc) + timedelta(hours=9)
    finished = history(api.tenant, [a, b], when, [Delivery.SUCCEEDED, Delivery.FAILED, Delivery.SUCCEEDED])
    (kept,) = history(api.tenant, [a, b], when, [Delivery.PENDING])
    done_of_kept = f"dlv_{kept.removeprefix('evt_')}00001"  # one of its two deliveries is final
    Delivery.objects.filter(pk=done_of_kept).update(status=Delivery.SUCCEEDED, next_attempt_at=None)
    DeliveryOutbox.objects.filter(delivery_id=done_of_kept).delete()
    recent = api.send_event("invoice.paid", {"n": 1})["id"]
    assert _counted() == _actual()

    pruned = events_prune()

    assert (pruned.events, pruned.deliveries, pruned.attempts, pruned.moved) == (3, 6, 6, 1)
    assert pruned.kept == 1  # and the batches of the default partition, which it went into, stepped over it
    assert pruned.partitions >= 1 and partitions.covering(old_day) is None
    assert set(Event.objects.filter(id__in=[*finished, kept, recent]).values_list("id", flat=True)) == {kept, recent}
    # the pending event moved on whole: both its deliveries (one final), their attempts, the outbox row
    assert _where("webhooks_event", "id", kept) == "webhooks_event_default"
    assert Delivery.objects.filter(event_id=kept).count() == 2
    assert DeliveryAttempt.objects.filter(delivery__event_id=kept).count() == 2
    pending = f"dlv_{kept.removeprefix('evt_')}00002"
    assert DeliveryOutbox.objects.filter(delivery_id=pending).exists()
    assert _counted() == _actual()  # the drop counted what it took, the move what it put back
    # the API still finds what was moved on, and nothing of what went
    assert api.get(f"deliveries/{pending}").json()["status"] == "pending"
    assert api.get(f"events/{kept}").status_code == 200
    assert api.get(f"events/{finished[0]}").status_code == 404
    # once the moved event's last delivery is final, the batches of the default partition take it
    Delivery.objects.filter(pk=pending).update(status=Delivery.FAILED, next_attempt_at=None)
    DeliveryOutbox.objects.filter(delivery_id=pending).delete()
    again = events_prune()
    assert (again.partitions, again.events, again.deliveries, again.attempts) == (0, 1, 2, 2)
    assert _counted() == _actual()


def test_a_drop_gives_up_at_once_on_a_busy_moment_and_the_next_run_takes_the_partition(api):
    """A transaction that holds a row of the partition (a manual retry locks its event FOR KEY SHARE) keeps the drop from
    its locks: it gives up after LOCK_TIMEOUT_MS, changing nothing, instead of queueing intake behind it."""
    old_day = partitions.today() - timedelta(days=45)
    partitions.ensure(first=old_day)
    span = partitions.covering(old_day)
    endpoint = create_endpoint(api, "https://a.example.com/")["id"]
    when = datetime.combine(old_day, datetime.min.time(), tzinfo=timezone.utc) + timedelta(hours=1)
    (event_id,) = history(api.tenant, [endpoint], when, [Delivery.SUCCEEDED])
    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM webhooks_event WHERE id = %s FOR KEY SHARE", [event_id])
                holding.set()
                release.wait(30)
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(5)
    started = time.monotonic()
    dropped = partitions.drop(span)
    waited = time.monotonic() - started
    assert not done.is_set(), "the drop waited for the transaction"
    release.set()
    thread.join()
    assert dropped.dropped is False and partitions.covering(old_day) == span
    assert waited < 10  # the lock timeout (partitions.LOCK_TIMEOUT_MS), with room for a loaded machine
    assert Event.objects.filter(pk=event_id).exists()
    assert events_prune().partitions >= 1 and not Event.objects.filter(pk=event_id).exists()


def test_what_changes_between_the_copies_and_the_lock_is_moved_on_as_it_is_at_the_lock(api):
    """The drop copies the pending events out before it takes the tables' lock; whatever commits in between (an
    attempt recorded, a failed delivery retried by hand, a deleted tenant's event erased) is read again under the
    lock, so what goes back in is what was there when the partition went. The interleaving is real: another
    session commits the changes just before the drop's LOCK TABLE runs."""
    old_day = partitions.today() - timedelta(days=40)
    partitions.ensure(first=old_day)
    span = partitions.covering(old_day)
    a, b = (create_endpoint(api, f"https://{n}.example.com/")["id"] for n in "ab")
    when = datetime.combine(old_day, datetime.min.time(), tzinfo=timezone.utc) + timedelta(hours=3)
    retried, erased, untouched = history(api.tenant, [a, b], when, [Delivery.PENDING] * 3)
    (failed,) = history(api.tenant, [a, b], when, [Delivery.FAILED])
    dlv = {event: [f"dlv_{event.removeprefix('evt_')}{rank:05}" for rank in (1, 2)]
           for event in (retried, erased, untouched, failed)}
    changed = []

    def meanwhile(execute, sql, params, many, context):
        if sql.startswith("LOCK TABLE") and not changed:
            with other_session() as other, other.transaction():
                # a retry's attempt recorded: the attempt, and the delivery moved on with it
                other.execute("INSERT INTO webhooks_deliveryattempt (delivery_id, number, started_at, duration_ms, "
                              "response_status, response_body, error, created_at) "
                              "VALUES (%s, 2, now(), 4, 503, '', '', now())", [dlv[retried][0]])
                other.execute("UPDATE webhooks_delivery SET attempt_count = 2, updated_at = now() WHERE id = %s",
                              [dlv[retried][0]])
            with other_session() as other, other.transaction():
                # a failed delivery retried by hand: its event is pending again
                other.execute("UPDATE webhooks_delivery SET status = 'pending', next_attempt_at = now() + "
                              "interval '1 day' WHERE id = %s", [dlv[failed][1]])
                other.execute("INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, periodic, tenant_id) "
                              "VALUES (%s, now() + interval '1 day', true, %s)", [dlv[failed][1], api.tenant.pk])
            with other_session() as other, other.transaction():
                # an event erased with its tenant's: its attempts, deliveries, outbox rows and itself
                other.execute("DELETE FROM webhooks_deliveryoutbox WHERE delivery_id = ANY(%s)", [dlv[erased]])
                other.execute("DELETE FROM webhooks_deliveryattempt WHERE delivery_id = ANY(%s)", [dlv[erased]])
                other.execute("DELETE FROM webhooks_delivery WHERE id = ANY(%s)", [dlv[erased]])
                other.execute("DELETE FROM webhooks_event WHERE id = %s", [erased])
            changed.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(meanwhile):
        dropped = partitions.drop(span)

    assert changed and dropped.dropped and partitions.covering(old_day) is None
    assert dropped.moved_events == 3  # retried, untouched, and the failed one retried by hand; not the erased
    assert set(Event.objects.filter(id__in=[retried, erased, untouched, failed]).values_list("id", flat=True)) == {
        retried, untouched, failed}
    assert all(_where("webhooks_event", "id", event) == "webhooks_event_default" for event in (retried, untouched, failed))
    assert Delivery.objects.get(pk=dlv[retried][0]).attempt_count == 2
    assert sorted(DeliveryAttempt.objects.filter(delivery_id=dlv[retried][0]).values_list("number", flat=True)) == [1, 2]
    assert DeliveryAttempt.objects.filter(delivery__event_id=untouched).count() == 2
    assert Delivery.objects.get(pk=dlv[failed][1]).status == Delivery.PENDING
    assert Delivery.objects.get(pk=dlv[failed][0]).status == Delivery.FAILED  # its sibling, moved with it
    assert DeliveryAttempt.objects.filter(delivery__event_id=failed).count() == 2
    assert DeliveryOutbox.objects.filter(delivery_id=dlv[failed][1]).exists()
    assert not Delivery.objects.filter(event_id=erased).exists()
    assert _counted() == _actual()
    assert partitions.drop_detached() == []  # the detached tables went after the lock


def test_a_table_a_drop_detached_but_left_behind_goes_at_the_next_run(api):
    """A process that died between a drop's commit and its dropping of the detached tables leaves them behind;
    the next run drops them before it makes partitions (their names are a partition's: making that span again
    would fail on them)."""
    old_day = partitions.today() - timedelta(days=55)
    partitions.ensure(first=old_day)
    span = partitions.covering(old_day)
    for part in partitions.TABLES:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {part.table} DETACH PARTITION {partitions.name(part.table, span)}")
    assert partitions.covering(old_day) is None
    # the span is made again for the day asked for: under the names the leftovers held, so they went first
    assert partitions.ensure(first=old_day, last=old_day) == [partitions.name(part.table, span)
                                                              for part in partitions.TABLES]
    assert partitions.covering(old_day) == span
    with connection.cursor() as cursor:
        cursor.execute("SELECT bool_and(relispartition), count(*) FROM pg_class WHERE relname = ANY(%s)",
                       [[partitions.name(part.table, span) for part in partitions.TABLES]])
        assert cursor.fetchone() == (True, 3)


def test_a_lease_or_outbox_row_left_of_a_dropped_delivery_goes_with_it(api):
    old_day = partitions.today() - timedelta(days=50)
    partitions.ensure(first=old_day)
    endpoint = create_endpoint(api, "https://a.example.com/")["id"]
    when = datetime.combine(old_day, datetime.min.time(), tzinfo=timezone.utc)
    (event_id,) = history(api.tenant, [endpoint], when, [Delivery.FAILED])
    delivery_id = f"dlv_{event_id.removeprefix('evt_')}00001"
    DeliveryOutbox.objects.create(delivery_id=delivery_id, due_at=when, published_at=when, tenant=api.tenant)
    DeliveryLease.objects.create(delivery_id=delivery_id, endpoint_id=endpoint, until=when)
    assert events_prune().partitions >= 1
    assert not DeliveryOutbox.objects.filter(delivery_id=delivery_id).exists()
    assert not DeliveryLease.objects.filter(delivery_id=delivery_id).exists()


def test_the_migration_moves_a_populated_history_into_partitions(db):
    """0028 on a database of its own holding rows (the test database is not migrated back and forth): each row in
    its day's partition, or in the default one if older than retention or not a ULID; the counts, the attempts'
    sequence, the foreign keys and the unique rules as they were."""
    params = connection.settings_dict
    name = f"{params['NAME']}_partitions"
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

    now = datetime.now(timezone.utc)
    rows = {"today": ids.made_at("evt", now), "week": ids.made_at("evt", now - timedelta(days=7)),
            "ancient": ids.made_at("evt", now - timedelta(days=400)), "by_hand": "evt_by_hand"}
    try:
        migrate("0027")
        with psycopg.connect(server + f" dbname={name}", autocommit=True) as conn:
            conn.execute("INSERT INTO webhooks_tenant (id, name, created_at, metadata, delivery_weight) "
                         "VALUES ('tnt_1', 't', now(), '{}', 1)")
            conn.execute("""INSERT INTO webhooks_endpoint (id, tenant_id, url, description, event_types, channels,
                                enabled, disabled_reason, consecutive_failures, failed_probes, ordering, created_at,
                                updated_at, kind, signature)
                            VALUES ('ep_1', 'tnt_1', 'https://a.example.com/', '', '{}', '{}', true, '', 0, 0,
                                    'unordered', now(), now(), 'http', 'v1')""")
            for label, event_id in rows.items():
                made = {"week": now - timedelta(days=7), "ancient": now - timedelta(days=400)}.get(label, now)
                conn.execute("""INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
                                VALUES (%s, 'tnt_1', 'a.b', '{}', '\\x7b7d', '', %s)""", [event_id, made])
                delivery_id = "dlv_" + event_id.removeprefix("evt_") + "00001"
                conn.execute("""INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                    created_at, updated_at)
                                VALUES (%s, 'tnt_1', %s, 'ep_1', %s, 1, %s, %s)""",
                             [delivery_id, event_id, "pending" if label == "week" else "failed", made, made])
                conn.execute("""INSERT INTO webhooks_deliveryattempt (delivery_id, number, started_at, duration_ms,
                                    response_body, error, created_at) VALUES (%s, 1, %s, 3, '', '', %s)""",
                             [delivery_id, made, made])
            counted = conn.execute("SELECT sum(pending), sum(failed) FROM webhooks_deliverycount").fetchone()
        migrate("0028")
        with psycopg.connect(server + f" dbname={name}", autocommit=True) as conn:
            def where(table, column, value):
                return conn.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s",
                                    [value]).fetchone()[0]

            for label, event_id in rows.items():
                day = {"today": now, "week": now - timedelta(days=7)}.get(label)
                span = day and partitions.aligned(day.date(), partitions.span_days())
                expected = (partitions.name("webhooks_event", span) if span else "webhooks_event_default")
                assert where("webhooks_event", "id", event_id) == expected, label
                delivery_id = "dlv_" + event_id.removeprefix("evt_") + "00001"
                assert where("webhooks_delivery", "id", delivery_id) == expected.replace("event", "delivery")
                assert where("webhooks_deliveryattempt", "delivery_id", delivery_id) == expected.replace(
                    "event", "deliveryattempt")
            assert conn.execute("SELECT sum(pending), sum(failed) FROM webhooks_deliverycount").fetchone() == counted
            # the attempts' ids go on from where they were; the counts' triggers work on the new table
            conn.execute("""INSERT INTO webhooks_deliveryattempt (delivery_id, number, started_at, duration_ms,
                                response_body, error, created_at) VALUES (%s, 2, now(), 3, '', '', now())""",
                         ["dlv_" + rows["today"].removeprefix("evt_") + "00001"])
            assert conn.execute("SELECT count(DISTINCT id), count(*) FROM webhooks_deliveryattempt").fetchone() == (5, 5)
            conn.execute("UPDATE webhooks_delivery SET status = 'succeeded' WHERE status = 'pending'")
            assert conn.execute("SELECT sum(pending), sum(failed) FROM webhooks_deliverycount").fetchone() == (
                counted[0] - 1, counted[1])
            with pytest.raises(psycopg.errors.UniqueViolation):  # one delivery per event and endpoint, as before
                conn.execute("""INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status,
                                    attempt_count, created_at, updated_at)
                                VALUES (%s, 'tnt_1', %s, 'ep_1', 'failed', 1, now(), now())""",
                             ["dlv_" + rows["today"].removeprefix("evt_") + "00002", rows["today"]])
            with pytest.raises(psycopg.errors.ForeignKeyViolation):  # its foreign keys came with it
                conn.execute("""INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id,
                                    created_at) VALUES (%s, 'tnt_nobody', 'a.b', '{}', '\\x7b7d', '', now())""",
                             [ids.made_at("evt", now)])
    finally:
        with psycopg.connect(server + " dbname=postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_delivery_whose_id_does_not_extend_its_events_is_refused(api):
    """What the partitions rest on (an event's deliveries lie in its day, and their ids bound its own) is a check,
    not a habit of intake's."""
    from django.db import IntegrityError

    endpoint = create_endpoint(api, "https://a.example.com/")["id"]
    (event_id,) = history(api.tenant, [endpoint], datetime.now(timezone.utc), [Delivery.SUCCEEDED])
    with pytest.raises(IntegrityError, match="delivery_extends_event"), transaction.atomic():
        Delivery.objects.create(id=ids.made_at("dlv", datetime.now(timezone.utc)), tenant=api.tenant,
                                event_id=event_id, endpoint_id=endpoint)


def test_making_partitions_gives_up_at_once_on_a_busy_moment_too(api):
    """A partition is made under its table's lock as a drop is: a transaction on the table (intake's, here one
    that holds an event's row) makes `ensure` leave the day to the next run after LOCK_TIMEOUT_MS."""
    far = partitions.spans()[-1].end + timedelta(days=1)
    endpoint = create_endpoint(api, "https://a.example.com/")["id"]
    (event_id,) = history(api.tenant, [endpoint], datetime.now(timezone.utc), [Delivery.SUCCEEDED])
    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM webhooks_event WHERE id = %s FOR KEY SHARE", [event_id])
                holding.set()
                release.wait(30)
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(5)
    made = partitions.ensure(last=far)
    assert not done.is_set(), "making the partition waited for the transaction"
    release.set()
    thread.join()
    assert made == [] and partitions.covering(far) is None
    assert partitions.ensure(last=far) == [partitions.name(p.table, partitions.covering(far)) for p in partitions.TABLES]
