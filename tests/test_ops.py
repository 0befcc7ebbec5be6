"""/healthz and /metrics: against real PostgreSQL and Redis, and across real processes."""
import threading
import time
from datetime import timedelta

import pytest
import requests
from django.db import connection, transaction
from django.db.models import Sum
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import past_todays_partition, wait_until
from tests.processes import celery_beat, celery_worker, free_port, gunicorn, run_dir
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryCount, DeliveryLease, DeliveryOutbox, Endpoint, Event, Heartbeat, Tenant
from webhooks.delivery.retries import delivery_retry
from webhooks.delivery.engine import delivery_attempt
from webhooks.services.endpoints import endpoint_delete, endpoint_disable
from webhooks.services.events import event_ingest
from webhooks.services.retention import events_prune
from webhooks.tasks import dispatch_due

pytestmark = pytest.mark.django_db(transaction=True)


def _samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_healthz_is_200_when_database_and_broker_answer_and_says_how_old_the_dispatchers_last_run_is(settings):
    interval = settings.WEBHOOK_DISPATCH_INTERVAL_SECONDS
    never = Client().get("/healthz")
    assert never.status_code == 200
    assert never.json() == {"status": "degraded", "database": "ok", "broker": "ok",
                            "dispatcher": {"last_run_age_seconds": None, "status": "never ran"}}
    started = time.monotonic()
    dispatch_due()  # what beat's task runs
    fresh = Client().get("/healthz").json()
    took = time.monotonic() - started
    # the age is that of this run: no older than the time since it started (rounded to 0.1 s); fresh within
    # 3 intervals (on a loaded machine the run and the request alone have taken 0.5 s)
    age = fresh["dispatcher"]["last_run_age_seconds"]
    assert 0 <= age <= took + 0.05, (age, took)
    expected = "ok" if age <= 3 * interval else "stale"
    assert fresh["dispatcher"]["status"] == expected and fresh["status"] == ("ok" if expected == "ok" else "degraded")
    Heartbeat.objects.filter(name="dispatcher").update(at=timezone.now() - timedelta(seconds=3 * interval + 1))
    stale = Client().get("/healthz")
    assert stale.status_code == 200  # the API serves; retries and recoveries wait for a beat
    assert stale.json()["status"] == "degraded" and stale.json()["dispatcher"]["status"] == "stale"
    samples = _samples(Client().get("/metrics").content.decode())
    assert 3 * interval + 1 <= samples[("herald_dispatcher_last_run_age_seconds", ())] < 3 * interval + 30


@pytest.mark.slow
@pytest.mark.parametrize("broken,env", [
    ("broker", {"CELERY_BROKER_URL": "redis://127.0.0.1:1/0"}),
    ("database", {"DATABASE_URL": "postgres://127.0.0.1:1/herald"}),
])
def test_healthz_is_503_when_either_is_down(broken, env):
    server = gunicorn(free_port(), workers=1, **env)
    try:
        response = requests.get(f"{server.url}/healthz", timeout=20)
    finally:
        server.stop()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body[broken] == "unavailable"
    assert body["broker" if broken == "database" else "database"] == "ok"


def test_delivery_state_gauges_come_from_the_database(api):
    assert api.post("endpoints", {"url": "https://a.example.com/"}).status_code == 201
    ids = [api.delivery_id("a.b") for _ in range(3)]
    # one due for 90 s and not yet published, one failed (its outbox row consumed by its claim)
    Delivery.objects.filter(pk=ids[0]).update(next_attempt_at=timezone.now() - timedelta(seconds=90))
    DeliveryOutbox.objects.filter(delivery_id=ids[0]).update(due_at=timezone.now() - timedelta(seconds=90))
    Delivery.objects.filter(pk=ids[1]).update(status=Delivery.FAILED)
    DeliveryOutbox.objects.filter(delivery_id=ids[1]).delete()
    response = Client().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    samples = _samples(response.content.decode())
    assert samples[("herald_deliveries_pending", ())] == 2
    assert samples[("herald_deliveries_failed", ())] == 1
    assert 90 <= samples[("herald_oldest_due_delivery_age_seconds", ())] < 120
    # published two minutes ago and still waiting for a worker counts too
    DeliveryOutbox.objects.filter(delivery_id=ids[2]).update(due_at=timezone.now() - timedelta(seconds=150),
                                                             published_at=timezone.now() - timedelta(seconds=140))
    samples = _samples(Client().get("/metrics").content.decode())
    assert 150 <= samples[("herald_oldest_due_delivery_age_seconds", ())] < 180
    assert samples[("herald_delivery_attempts_in_flight", ())] == 0
    assert samples[("herald_endpoints_tripped", ())] == 0
    DeliveryLease.objects.create(delivery_id=ids[2], endpoint=Endpoint.objects.get(),
                                 until=timezone.now() + timedelta(seconds=30))
    Endpoint.objects.update(tripped_at=timezone.now())
    samples = _samples(Client().get("/metrics").content.decode())
    assert samples[("herald_delivery_attempts_in_flight", ())] == 1
    assert samples[("herald_endpoints_tripped", ())] == 1


def test_metrics_answer_only_the_metrics_token_once_one_is_set(settings):
    assert Client().get("/metrics").status_code == 200  # unset: open, as before
    settings.METRICS_TOKEN = "scrape-secret-123"
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": "Basic scrape-secret-123"}):
        refused = Client().get("/metrics", **headers)
        assert refused.status_code == 401 and refused["Content-Type"] == "application/problem+json"
        assert refused.json()["code"] == "not_authenticated" and "herald_" not in refused.content.decode()
        assert refused["WWW-Authenticate"].startswith("Bearer")
    allowed = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-123")
    assert allowed.status_code == 200 and b"herald_deliveries_pending" in allowed.content
    assert Client().get("/healthz").status_code == 200  # the health check stays open


@pytest.mark.slow
def test_metrics_add_up_across_gunicorn_and_celery_processes(api, receiver):
    metrics_dir = str(run_dir("metrics"))
    env = {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    server = gunicorn(free_port(), workers=2, **env)
    processes = [server, celery_worker("metrics", concurrency=2, **env), celery_beat()]
    try:
        assert api.post("endpoints", {"url": receiver.url()}).status_code == 201  # in-process: not counted
        headers = {"Authorization": f"Bearer {api.token}"}

        def post(key, body):
            return requests.post(f"{server.url}/api/v1/events", json=body, timeout=20,
                                 headers={**headers, **({"Idempotency-Key": key} if key else {})})

        event = {"type": "invoice.paid", "data": {}}
        ids = [post(f"metrics-key-{n:04d}", event).json()["deliveries"][0]["id"] for n in range(6)]
        assert post("metrics-key-0000", event).headers["Idempotent-Replay"] == "true"
        assert post("metrics-key-0001", event).headers["Idempotent-Replay"] == "true"
        assert post("metrics-key-0002", {"type": "other.type", "data": {}}).status_code == 409
        assert post(None, event).status_code == 400
        wait_until(lambda: Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() == 6)

        # every scrape, whichever gunicorn process answers it, sees the sum over all processes
        for _ in range(4):
            samples = _samples(requests.get(f"{server.url}/metrics", timeout=10).text)
            intake = {dict(labels)["outcome"]: value for (name, labels), value in samples.items()
                      if name == "herald_intake_requests_total"}
            assert intake == {"executed": 6, "replayed": 2, "mismatch": 1, "rejected": 1}
            assert samples[("herald_delivery_attempts_total", (("endpoint_class", "healthy"), ("outcome", "success")))] == 6
            assert samples[("herald_delivery_attempt_duration_seconds_count", ())] == 6
            assert samples[("herald_deliveries_pending", ())] == 0
    finally:
        for process in processes:
            process.stop()


def _counted() -> tuple[int, int]:
    sums = DeliveryCount.objects.aggregate(pending=Sum("pending"), failed=Sum("failed"))
    return sums["pending"] or 0, sums["failed"] or 0


def _exact() -> tuple[int, int]:
    return (Delivery.objects.filter(status=Delivery.PENDING).count(),
            Delivery.objects.filter(status=Delivery.FAILED).count())


@pytest.mark.usefixtures("days_restored")
def test_pending_and_failed_counts_stay_exact_through_every_writer(api, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "1"  # a second failed attempt fails the delivery
    for path in ("/a", "/b", "/c"):
        assert api.post("endpoints", {"url": receiver.url(path)}).status_code == 201
    a, b, c = sorted(Endpoint.objects.all(), key=lambda endpoint: endpoint.url)
    seen = []

    def check(step):
        seen.append(_exact())
        assert _counted() == _exact(), step

    ids = {path: [] for path in "abc"}
    for _ in range(4):  # intake: three pending deliveries each
        for delivery in api.send_event("a.b")["deliveries"]:
            ids[{a.pk: "a", b.pk: "b", c.pk: "c"}[delivery["endpoint_id"]]].append(delivery["id"])
    check("intake")
    assert delivery_attempt(delivery_id=ids["a"][0]) == Delivery.SUCCEEDED
    check("record: succeeded")
    receiver.script("/a", Answer(500), Answer(500))
    assert delivery_attempt(delivery_id=ids["a"][1]) == Delivery.PENDING
    check("record: a retry")
    Delivery.objects.filter(pk=ids["a"][1]).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=ids["a"][1]) == Delivery.FAILED
    check("record: failed")
    delivery_retry(delivery=Delivery.objects.get(pk=ids["a"][1]))
    check("manual retry")
    endpoint_disable(endpoint_id=b.pk, reason="test")
    check("endpoint disabled: its pending deliveries failed")
    endpoint_delete(endpoint=c)
    check("endpoint deleted: its pending deliveries cancelled")
    Delivery.objects.filter(pk=ids["a"][2]).update(status=Delivery.FAILED)
    check("any other update")
    pruned = events_prune(now=past_todays_partition(), pause_ratio=0)
    assert pruned.deliveries > 0
    check("retention")
    assert len(set(seen)) >= 5  # the steps did move the numbers
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Delivery._meta.db_table}")
    assert _counted() == (0, 0)


def test_count_writers_do_not_wait_for_one_another():
    """Two intakes in open transactions at once: the second adds to another shard, and commits while the first
    still holds its own (a single counter row would make it wait for the first's commit)."""
    tenant = Tenant.objects.create(name="counts")
    Endpoint.objects.create(tenant=tenant, url="https://a.example.com/")
    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def first():
        try:
            with transaction.atomic():
                event_ingest(tenant=tenant, event_type="a.b", data={}, channels=[])
                holding.set()
                release.wait(20)
        finally:
            connection.close()

    def second():
        try:
            holding.wait(20)
            with transaction.atomic():
                event_ingest(tenant=tenant, event_type="a.b", data={}, channels=[])
            done.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        assert done.wait(10), "the second intake waited for the first one's transaction"
    finally:
        release.set()
        for thread in threads:
            thread.join(20)
    assert Event.objects.count() == 2
    assert _counted() == _exact() == (2, 0)
    assert DeliveryCount.objects.filter(pending__gt=0).count() == 2


def test_attempts_are_counted_by_endpoint_class(api, receiver):
    def attempts():
        return {labels: value for (name, labels), value in _samples(Client().get("/metrics").content.decode()).items()
                if name == "herald_delivery_attempts_total"}

    assert api.post("endpoints", {"url": receiver.url("/x")}).status_code == 201
    ids = [api.delivery_id("a.b") for _ in range(4)]
    receiver.script("/x", Answer(500), Answer(500), Answer(500))
    before = attempts()
    for delivery_id in ids[:2]:
        delivery_attempt(delivery_id=delivery_id)  # the first fails a healthy endpoint, the second a failing one
    Endpoint.objects.update(failing_since=timezone.now() - timedelta(hours=2))
    delivery_attempt(delivery_id=ids[2])  # failing for two hours: down
    delivery_attempt(delivery_id=ids[3])  # a success, recorded on the slow path (it resets the failure clock)
    after = attempts()
    grew = {dict(labels)["endpoint_class"] + " " + dict(labels)["outcome"]: after[labels] - before.get(labels, 0)
            for labels in after if after[labels] != before.get(labels, 0)}
    assert grew == {"healthy http_error": 1, "failing http_error": 1, "down http_error": 1, "down success": 1}


@pytest.mark.slow
def test_live_workers_come_from_heartbeats_in_postgresql():
    def live():
        return _samples(Client().get("/metrics").content.decode())[("herald_workers_live", ())]

    assert live() == 0
    first, second = celery_worker("live-1"), celery_worker("live-2")
    try:
        wait_until(lambda: live() == 2, timeout=10, message="two live workers")
        assert Heartbeat.objects.filter(name__startswith="worker:live-").count() == 2
        second.stop()  # a worker shutting down says goodbye: not live at once
        assert live() == 1
        first.kill()  # one that dies is not live once its heartbeat is 3 intervals old
        assert live() == 1
        wait_until(lambda: live() == 0, timeout=3 * 1 + 2, message="the killed worker to age out")
    finally:
        first.stop()
        second.stop()


def test_responses_are_counted_by_area_and_status(api):
    def responses():
        return {labels: value for (name, labels), value in _samples(Client().get("/metrics").content.decode()).items()
                if name == "herald_http_responses_total"}

    before = responses()
    assert Client().get("/api/v1/events").status_code == 401
    assert Client().get("/healthz").status_code == 200
    assert Client().get("/no/such/page").status_code == 404
    # a statement the database refuses: the API answers 500 (no input can cause this), and it is counted
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {Event._meta.db_table} RENAME TO herald_event_away")
    try:
        assert api.post("events", {"type": "a.b", "data": {}}).status_code == 500
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE herald_event_away RENAME TO {Event._meta.db_table}")
    after = responses()
    grew = {(dict(labels)["area"], dict(labels)["status"]): after[labels] - before.get(labels, 0)
            for labels in after if after[labels] != before.get(labels, 0)}
    # the /metrics scrape that read `before` is counted too
    assert grew == {("api", "401"): 1, ("ops", "200"): 2, ("other", "404"): 1, ("api", "500"): 1}
