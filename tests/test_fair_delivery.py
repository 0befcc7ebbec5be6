"""Fair delivery across tenants (SPEC §10, webhooks/delivery/scheduling.py): the relays' choice of what to
publish, in PostgreSQL, and then with real workers: a quiet tenant's first attempt is not held behind a
loud tenant's backlog, weights 1 and 3 share the workers 1 : 3, and a tenant alone gets all of them."""
import importlib
import random
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from intake.credentials import credential_create, credential_create_platform
from tests.conftest import Api, all_succeeded, create_endpoint, wait_until
from tests.processes import celery_worker
from tests.receiver import Answer
from webhooks.conf import herald_settings
from webhooks.delivery import scheduling
from webhooks.delivery.relay import deliveries_relay
from webhooks.delivery.retries import deliveries_retry
from webhooks.models import Delivery, DeliveryAttempt, DeliveryOutbox, Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _tenant(name: str, weight: int = 1) -> Api:
    credential, token = credential_create(tenant_name=name)
    Tenant.objects.filter(pk=credential.tenant_id).update(delivery_weight=weight)
    return Api(token, credential)


def _backlog(api: Api, endpoint_ids: list[str], count: int, *, age: float = 60.0) -> list[str]:
    """`count` first attempts of `api`'s tenant waiting in the outbox (due `age` s ago), spread over its
    endpoints: written directly, as intake would leave them before any relay ran, but without the tenant
    in the outbox row (the trigger fills it in)."""
    tenant = api.tenant.pk
    per_event = len(endpoint_ids)
    events = -(-count // per_event)
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
            SELECT 'evt_' || right(%(tenant)s, 12) || lpad(g::text, 8, '0'), %(tenant)s, 'invoice.paid', '{}',
                   '{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{}}'::bytea, '',
                   now() - make_interval(secs => %(age)s)
              FROM generate_series(1, %(events)s) g""", {"tenant": tenant, "events": events, "age": age})
        cursor.execute("""
            WITH made AS (
                INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                               next_attempt_at, created_at, updated_at)
                SELECT 'dlv_' || right(%(tenant)s, 12) || lpad(((g - 1) / %(per_event)s + 1)::text, 8, '0')
                           || lpad(((g - 1) %% %(per_event)s + 1)::text, 5, '0'), %(tenant)s,
                       'evt_' || right(%(tenant)s, 12) || lpad(((g - 1) / %(per_event)s + 1)::text, 8, '0'),
                       (%(endpoints)s::varchar[])[(g - 1) %% %(per_event)s + 1], 'pending', 0,
                       now() - make_interval(secs => %(age)s), now(), now()
                  FROM generate_series(1, %(count)s) g
                RETURNING id, next_attempt_at
            )
            INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic)
            SELECT id, next_attempt_at, NULL, false FROM made RETURNING delivery_id""",
                       {"tenant": tenant, "per_event": per_event, "endpoints": endpoint_ids, "count": count,
                        "age": age})
        return sorted(row[0] for row in cursor.fetchall())


def _tenant_of(ids) -> dict[str, str]:
    return dict(Delivery.objects.filter(pk__in=ids).values_list("id", "tenant_id"))


def _count(ids, tenant) -> int:
    return sum(1 for t in _tenant_of(ids).values() if t == tenant)


# --- delivery_weight on the tenants API ----------------------------------------------------------------------


@pytest.fixture
def platform(db):
    credential, token = credential_create_platform(name="platform")
    return Api(token, credential)


def test_a_tenants_delivery_weight_is_1_unless_given_and_can_be_changed(platform):
    plain = platform.post("tenants", {"name": "plain"})
    assert plain.status_code == 201 and plain.json()["delivery_weight"] == 1
    heavy = platform.post("tenants", {"name": "heavy", "delivery_weight": 100})
    assert heavy.status_code == 201 and heavy.json()["delivery_weight"] == 100
    changed = platform.patch(f"tenants/{plain.json()['id']}", {"delivery_weight": 3})
    assert changed.status_code == 200 and changed.json()["delivery_weight"] == 3
    assert Tenant.objects.get(pk=plain.json()["id"]).delivery_weight == 3
    assert platform.get(f"tenants/{heavy.json()['id']}").json()["delivery_weight"] == 100
    # a PATCH without it leaves it be
    assert platform.patch(f"tenants/{heavy.json()['id']}", {"name": "heavier"}).json()["delivery_weight"] == 100


@pytest.mark.parametrize("weight", [0, 101, -1, "heavy", 1.5, None, True, [1]])
def test_a_delivery_weight_out_of_1_to_100_is_a_validation_error_and_changes_nothing(platform, weight):
    tenants = Tenant.objects.count()
    refused = platform.post("tenants", {"name": "x", "delivery_weight": weight})
    assert refused.status_code == 400 and refused["content-type"] == "application/problem+json", refused.content
    assert refused.json()["code"] == "validation_error" and "delivery_weight" in refused.json()["errors"]
    assert Tenant.objects.count() == tenants
    tenant = platform.post("tenants", {"name": "y", "delivery_weight": 7}).json()
    refused = platform.patch(f"tenants/{tenant['id']}", {"delivery_weight": weight})
    assert refused.status_code == 400 and refused.json()["code"] == "validation_error"
    assert Tenant.objects.get(pk=tenant["id"]).delivery_weight == 7


# --- the relays' choice, in PostgreSQL ------------------------------------------------------------------------


def test_one_pass_shares_the_room_by_weight_and_a_quiet_tenant_goes_first(broker, settings):
    settings.WEBHOOK_PUBLISH_WINDOW = 400
    loud, heavy, quiet = _tenant("loud"), _tenant("heavy", weight=3), _tenant("quiet")
    _backlog(loud, [create_endpoint(loud, "https://a.example.com/")["id"]], 1000, age=120)
    _backlog(heavy, [create_endpoint(heavy, "https://b.example.com/")["id"]], 1000, age=90)
    create_endpoint(quiet, "https://c.example.com/")
    quiet_delivery = quiet.delivery_id("invoice.paid")  # the newest of all, by a minute

    scheduler = scheduling.Scheduler()
    published = deliveries_relay(batch=400, scheduler=scheduler)

    # one pass fills the window: the quiet tenant's one delivery, and the rest 1 : 3
    assert len(published) == 400
    assert quiet_delivery in published
    assert _count(published, loud.tenant.pk) == 100 - 1 or _count(published, loud.tenant.pk) == 100
    assert 297 <= _count(published, heavy.tenant.pk) <= 300
    # its message carries the quiet tenant's delivery among the first of the round, not behind the backlog
    first_message = broker.published(settings.CELERY_TASK_DEFAULT_QUEUE)[0][1][0]
    assert quiet_delivery in first_message[:4]
    # and the window is full: nothing more goes out until the workers claim some
    assert scheduler.backlog


def test_the_window_bounds_what_is_published_and_unclaimed_and_claims_make_room(broker, settings):
    settings.WEBHOOK_PUBLISH_WINDOW = 50
    settings.WEBHOOK_DISPATCH_SECONDS = 0.3
    loud = _tenant("loud")
    ids = _backlog(loud, [create_endpoint(loud, "https://a.example.com/")["id"]], 120)
    assert len(deliveries_relay(batch=1000, scheduler=scheduling.Scheduler())) == 50
    assert DeliveryOutbox.objects.filter(published_at__isnull=False).count() == 50
    # a worker claims 30 of them (a claim deletes the outbox row): 30 more may go
    published = list(DeliveryOutbox.objects.filter(published_at__isnull=False).values_list("delivery_id", flat=True))
    DeliveryOutbox.objects.filter(delivery_id__in=published[:30]).delete()
    assert len(deliveries_relay(batch=1000, scheduler=scheduling.Scheduler())) == 30
    # what was published long ago and never claimed (lost, or behind a full engine) is the dispatcher's
    # business, and holds no room
    DeliveryOutbox.objects.filter(published_at__isnull=False).update(
        published_at=timezone.now() - timedelta(seconds=60))
    assert len(deliveries_relay(batch=1000, scheduler=scheduling.Scheduler())) == 40
    assert not DeliveryOutbox.objects.filter(delivery_id__in=ids, published_at__isnull=True).exists()


def test_a_tenant_alone_takes_the_whole_room_whatever_its_weight(broker, settings):
    settings.WEBHOOK_PUBLISH_WINDOW = 300
    alone = _tenant("alone", weight=1)
    _backlog(alone, [create_endpoint(alone, "https://a.example.com/")["id"]], 500)
    _tenant("idle", weight=100)  # a tenant with nothing waiting takes no share
    assert len(deliveries_relay(batch=1000, scheduler=scheduling.Scheduler())) == 300


def test_with_more_tenants_than_room_each_gets_its_turn_in_rotation(broker, settings):
    settings.WEBHOOK_PUBLISH_WINDOW = 10_000
    tenants = [_tenant(f"t{n:02}") for n in range(30)]
    for api in tenants:
        _backlog(api, [create_endpoint(api, "https://a.example.com/")["id"]], 5)
    scheduler = scheduling.Scheduler()
    served = []
    for _ in range(4):  # passes of 10 rows: ten tenants, one row apiece, the next ten the next pass
        with transaction.atomic():
            chosen = scheduler.take(10)
        assert chosen.more
        served.append([row[3] for row in chosen.rows])
    assert [len(set(s)) for s in served] == [10, 10, 10, 10]
    assert set(served[0] + served[1] + served[2]) == {api.tenant.pk for api in tenants}
    assert served[3] == served[0]  # round again


def test_weights_hold_over_many_small_passes(broker):
    # the workers' claims free room a few ids at a time: the shares still come out 1 : 3
    light, heavy = _tenant("light", weight=1), _tenant("heavy", weight=3)
    _backlog(light, [create_endpoint(light, "https://a.example.com/")["id"]], 600)
    _backlog(heavy, [create_endpoint(heavy, "https://b.example.com/")["id"]], 600)
    scheduler = scheduling.Scheduler()
    got = {light.tenant.pk: 0, heavy.tenant.pk: 0}
    rooms = random.Random(33)
    while got[heavy.tenant.pk] < 540:
        with transaction.atomic():
            chosen = scheduler.take(rooms.randint(1, 10))
        for row in chosen.rows:
            got[row[3]] += 1
    assert abs(got[light.tenant.pk] / got[heavy.tenant.pk] - 1 / 3) < 0.01, got


def test_retries_manual_retries_and_recoveries_wait_their_tenants_turn_too(api, broker, settings):
    settings.WEBHOOK_PUBLISH_WINDOW = 100
    endpoint = create_endpoint(api, "https://a.example.com/")["id"]
    ids = _backlog(api, [endpoint], 300)
    # a record's retry (written by herald_delivery_record) and a manual retry (written without the tenant:
    # the trigger gives it) carry the tenant as a first attempt does
    failed = ids[:50]
    Delivery.objects.filter(pk__in=failed).update(status=Delivery.FAILED)
    DeliveryOutbox.objects.filter(delivery_id__in=failed).delete()
    deliveries_retry(delivery_ids=failed, now=timezone.now())
    assert set(DeliveryOutbox.objects.filter(delivery_id__in=failed).values_list("tenant_id", flat=True)) == {
        api.tenant.pk}
    quiet = _tenant("quiet")
    create_endpoint(quiet, "https://b.example.com/")
    quiet_delivery = quiet.delivery_id("invoice.paid")
    published = deliveries_relay(batch=100, scheduler=scheduling.Scheduler())
    assert quiet_delivery in published and len(published) == 100
    assert not DeliveryOutbox.objects.filter(tenant__isnull=True, published_at__isnull=True).exists()


def test_a_record_writes_its_retrys_tenant_itself(api, broker):
    endpoint = create_endpoint(api, "https://a.example.com/")["id"]
    (delivery_id,) = _backlog(api, [endpoint], 1)
    trigger = importlib.import_module("webhooks.migrations.0026_fair_delivery")
    with connection.cursor() as cursor:
        cursor.execute("SELECT go, lease_end FROM herald_delivery_claim(%s, 60, 10)", [delivery_id])
        go, lease_end = cursor.fetchone()
        assert go
        cursor.execute(trigger.DROP)  # the record must write the tenant itself (no lookup on the hot path)
        try:
            cursor.execute("""SELECT applied FROM herald_delivery_record(%s, 1, now(), 5, 500, '', '', 'pending',
                              now() + interval '1 minute', %s, %s, 10, false, 0)""", [delivery_id, lease_end, endpoint])
            assert cursor.fetchone() == (True,)
        finally:
            cursor.execute(trigger.TRIGGER)
    assert DeliveryOutbox.objects.get(delivery_id=delivery_id).tenant_id == api.tenant.pk


# --- with real workers ------------------------------------------------------------------------------------------


def _attempts(tenant_id: str) -> list:
    return sorted(DeliveryAttempt.objects.filter(delivery__tenant_id=tenant_id).values_list("started_at", flat=True))


@pytest.mark.slow
def test_a_quiet_tenants_first_attempt_is_not_held_behind_a_loud_tenants_backlog(receiver, processes):
    # given a loud tenant with 8,000 first attempts waiting for its 10 endpoints (each 10 at a time, answering
    # after 20 ms), and a quiet tenant with one endpoint
    loud, quiet = _tenant("loud"), _tenant("quiet")
    paths = [f"/loud/{n}" for n in range(10)]
    for path in paths:
        receiver.script(path, *[Answer(delay=0.02)] * 1000)
    backlog = 8000
    _backlog(loud, [create_endpoint(loud, receiver.url(path))["id"] for path in paths], backlog)
    create_endpoint(quiet, receiver.url("/quiet"))
    processes(celery_worker("fair", concurrency=200))
    wait_until(lambda: DeliveryAttempt.objects.filter(delivery__tenant_id=loud.tenant.pk).count() >= 200,
               timeout=60, message="the loud tenant's backlog being worked off")

    # when the quiet tenant posts an event every 100 ms meanwhile
    posted = {}
    for n in range(10):
        posted[quiet.delivery_id("invoice.paid", {"n": n})] = timezone.now()
        time.sleep(0.1)  # the input: the quiet tenant's pace
    wait_until(lambda: DeliveryAttempt.objects.filter(delivery_id__in=posted).count() == len(posted), timeout=60,
               message="the quiet tenant's first attempts")
    loud_waiting = Delivery.objects.filter(tenant_id=loud.tenant.pk, status=Delivery.PENDING).count()

    # then each of its first attempts started within a fraction of a second of its POST (a wide margin for a
    # loaded 2-core machine), while the loud tenant still had most of its backlog to go: far less than the
    # time the loud tenant's backlog ahead of it takes to work off at the rate it was worked off
    started = dict(DeliveryAttempt.objects.filter(delivery_id__in=posted, number=1).values_list(
        "delivery_id", "started_at"))
    waits = sorted((started[d] - posted[d]).total_seconds() for d in posted)
    loud_attempts = _attempts(loud.tenant.pk)
    window = [at for at in loud_attempts if min(started.values()) - timedelta(seconds=2) <= at <= max(started.values())]
    rate = len(window) / ((max(started.values()) - min(started.values())).total_seconds() + 2)
    assert loud_waiting > backlog / 4, f"the loud tenant's backlog was gone too soon to tell ({loud_waiting} left)"
    assert waits[-1] < 1.5, f"the quiet tenant's waits: {waits}"
    assert waits[-1] < 0.1 * loud_waiting / rate, (waits, loud_waiting, rate)


@pytest.mark.slow
def test_two_tenants_with_backlogs_share_the_workers_by_their_weights(receiver, processes):
    # given two tenants whose endpoints take all the worker can send (1,000 at a time, answering at once), one
    # of weight 1 and one of weight 3, each with 1,500 deliveries waiting
    light, heavy = _tenant("light", weight=1), _tenant("heavy", weight=3)
    for api, path in ((light, "/light"), (heavy, "/heavy")):
        _backlog(api, [create_endpoint(api, receiver.url(path), max_in_flight=1000)["id"]], 1500)

    # when one worker (50 attempts in flight) works them off
    processes(celery_worker("weights", concurrency=50))
    wait_until(lambda: len(_attempts(heavy.tenant.pk)) >= 1000, timeout=90, message="the heavy tenant's attempts")

    # then while both had deliveries waiting (until the heavy one had done half of its), they were sent 1 : 3
    heavy_at = _attempts(heavy.tenant.pk)
    since, until = heavy_at[99], heavy_at[849]  # past the first pass, and well before either runs dry
    light_n = sum(1 for at in _attempts(light.tenant.pk) if since <= at <= until)
    heavy_n = 750
    assert 0.25 <= light_n / heavy_n <= 0.42, f"light {light_n} : heavy {heavy_n}"


@pytest.mark.slow
def test_a_tenant_alone_uses_every_worker_slot(receiver, processes):
    # given one tenant (weight 1) with 300 deliveries for an endpoint that answers after 300 ms and takes
    # 1,000 at a time, while another tenant of weight 100 has nothing waiting
    alone = _tenant("alone", weight=1)
    _tenant("idle", weight=100)
    receiver.script("/slow", *[Answer(delay=0.3)] * 300)
    ids = _backlog(alone, [create_endpoint(alone, receiver.url("/slow"), max_in_flight=1000)["id"]], 300)

    # when one worker (50 attempts in flight) works them off
    processes(celery_worker("alone", concurrency=50))
    wait_until(lambda: all_succeeded(ids), timeout=60, message="the lone tenant's deliveries")

    # then it had the worker's every slot busy at once: fair shares cap nobody when nobody else waits
    assert receiver.path_max_in_flight["/slow"] >= 45


# --- visible: /metrics and the admin ----------------------------------------------------------------------------


def test_metrics_show_how_many_tenants_wait_how_much_and_how_long_without_a_label_per_tenant(broker):
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    big, small = _tenant("big"), _tenant("small")
    _backlog(big, [create_endpoint(big, "https://a.example.com/")["id"]], 1500, age=120)
    _backlog(small, [create_endpoint(small, "https://b.example.com/")["id"]], 3, age=2)
    families = {f.name: f for f in text_string_to_metric_families(Client().get("/metrics").content.decode())}

    def buckets(name):
        return {float(s.labels["le"]): s.value for s in families[name].samples if s.name == f"{name}_bucket"}

    depth = buckets("herald_tenant_waiting_deliveries")
    assert depth == {1: 0, 10: 1, 100: 1, 1000: 1, float("inf"): 2}
    age = buckets("herald_tenant_oldest_waiting_seconds")
    assert (age[1], age[5], age[60], age[300], age[float("inf")]) == (0, 1, 1, 2, 2)
    for name in ("herald_tenant_waiting_deliveries", "herald_tenant_oldest_waiting_seconds"):
        assert all(set(s.labels) <= {"le"} for s in families[name].samples)


def test_the_admins_tenant_list_shows_each_tenants_weight_and_what_it_has_waiting(admin_client, broker):
    from django.urls import reverse

    big, idle = _tenant("big", weight=7), _tenant("idle")
    _backlog(big, [create_endpoint(big, "https://a.example.com/")["id"]], 1200, age=90)
    page = admin_client.get(reverse("admin:webhooks_tenant_changelist") + "?o=-6").content.decode()
    assert "1000+" in page and ">7<" in page
    page = admin_client.get(reverse("admin:webhooks_tenant_change", args=[idle.tenant.pk])).content.decode()
    assert "delivery_weight" in page
    # a weight out of 1-100 is refused by the form, not by the database
    refused = admin_client.post(reverse("admin:webhooks_tenant_change", args=[idle.tenant.pk]),
                                {"name": "idle", "delivery_weight": 101, "metadata": "{}"})
    assert refused.status_code == 200 and Tenant.objects.get(pk=idle.tenant.pk).delivery_weight == 1
