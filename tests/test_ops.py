"""/healthz and /metrics: against real PostgreSQL and Redis, and across real processes."""
from datetime import timedelta

import pytest
import requests
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.processes import celery_beat, celery_worker, free_port, gunicorn, run_dir
from webhooks.models import Delivery, DeliveryLease, DeliveryOutbox, Endpoint, Heartbeat
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
    dispatch_due()  # what beat's task runs
    fresh = Client().get("/healthz").json()
    assert fresh["status"] == "ok" and fresh["dispatcher"]["status"] == "ok"
    assert 0 <= fresh["dispatcher"]["last_run_age_seconds"] < interval
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
    ids = [api.post("events", {"type": "a.b", "data": {}}).json()["deliveries"][0]["id"] for _ in range(3)]
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
            assert samples[("herald_delivery_attempts_total", (("outcome", "success"),))] == 6
            assert samples[("herald_delivery_attempt_duration_seconds_count", ())] == 6
            assert samples[("herald_deliveries_pending", ())] == 0
    finally:
        for process in processes:
            process.stop()
