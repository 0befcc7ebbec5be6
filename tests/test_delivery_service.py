"""The delivery service in-process, against a real receiver and PostgreSQL: decisions and claims."""
import uuid
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from tests.conftest import wait_until
from tests.processes import celery_worker, free_port, gunicorn, hosts_launcher
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryAttempt, DeliveryLease, Endpoint
from webhooks.delivery.claim import delivery_claim
from webhooks.delivery.engine import delivery_attempt
from webhooks.services.endpoints import endpoints_disable_failing

pytestmark = pytest.mark.django_db(transaction=True)


def _delivery(api, url, **extra):
    assert api.post("endpoints", {"url": url, **extra}).status_code == 201
    return api.delivery_id("invoice.paid")


def test_429_with_retry_after_pushes_the_next_attempt_later(api, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "1,60"
    delivery_id = _delivery(api, receiver.url())
    receiver.script("/hook", Answer(status=429, headers=(("Retry-After", "30"),)))
    before = timezone.now()
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
    delay = (Delivery.objects.get(pk=delivery_id).next_attempt_at - before).total_seconds()
    assert 29.5 <= delay <= 31  # the schedule said 1 s; the receiver asked for 30 s


def test_retry_after_is_capped_at_the_longest_step(api, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "1,20"
    delivery_id = _delivery(api, receiver.url())
    receiver.script("/hook", Answer(status=503, headers=(("Retry-After", "86400"),)))
    before = timezone.now()
    delivery_attempt(delivery_id=delivery_id)
    delay = (Delivery.objects.get(pk=delivery_id).next_attempt_at - before).total_seconds()
    assert 19.5 <= delay <= 21


def test_a_claimed_delivery_cannot_be_claimed_again_until_its_lease_ends(api, receiver):
    delivery_id = _delivery(api, receiver.url())
    first = delivery_claim(delivery_id=delivery_id)
    assert first is not None and first.number == 1
    assert delivery_claim(delivery_id=delivery_id) is None
    assert delivery_attempt(delivery_id=delivery_id) is None  # a duplicate task does nothing
    assert receiver.received == []
    DeliveryLease.objects.filter(delivery_id=delivery_id).update(until=timezone.now() - timedelta(seconds=1))
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    assert len(receiver.received) == 1


def test_a_host_that_resolves_to_loopback_only_at_delivery_time_is_refused(api, receiver, processes):
    """DNS rebinding, without touching the machine's /etc/hosts: the API runs where the name is public (so the
    endpoint is accepted, and nothing is ever sent there), the worker where it resolves to loopback, each in a
    mount namespace with its own /etc/hosts (tests/processes.py hosts_launcher)."""
    name = "rebind.herald-test.example"
    strict = {"WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false"}
    web = processes(gunicorn(free_port(), workers=1, threads=2, launcher=hosts_launcher(f"93.184.216.34 {name}"),
                             **strict))
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {api.token}"

    def post(path, body):
        response = session.post(f"{web.url}/api/v1/{path}", json=body, timeout=30,
                                headers={"Idempotency-Key": f"rebind-{uuid.uuid4()}"})
        assert response.status_code in (201, 202), response.text
        return response.json()

    post("endpoints", {"url": f"http://{name}:{receiver.port}/hook"})  # public at creation time: accepted
    delivery_id = post("events", {"type": "invoice.paid", "data": {}})["deliveries"][0]["id"]
    # the worker resolves the same name to loopback at delivery time
    processes(celery_worker("rebind", launcher=hosts_launcher(f"127.0.0.1 {name}"), **strict))
    wait_until(lambda: DeliveryAttempt.objects.filter(delivery_id=delivery_id).exists(), timeout=60,
               message="the worker's attempt")
    (attempt,) = api.get(f"deliveries/{delivery_id}").json()["attempts"]
    assert attempt["response_status"] is None and "blocked" in attempt["error"]
    assert receiver.received == []


def test_endpoints_failing_continuously_past_the_limit_are_disabled(api, settings):
    settings.WEBHOOK_DISABLE_AFTER_SECONDS = 3600
    now = timezone.now()
    for n, failing_since in enumerate([now - timedelta(hours=2), now - timedelta(minutes=30), None]):
        assert api.post("endpoints", {"url": f"https://{n}.example.com/"}).status_code == 201
        Endpoint.objects.filter(url=f"https://{n}.example.com/").update(failing_since=failing_since)
    assert endpoints_disable_failing(now=now) == 1
    assert list(Endpoint.objects.filter(enabled=False).values_list("url", flat=True)) == ["https://0.example.com/"]


def test_a_success_clears_the_failure_clock(api, receiver):
    delivery_id = _delivery(api, receiver.url())
    receiver.script("/hook", 500)
    delivery_attempt(delivery_id=delivery_id)
    assert Endpoint.objects.get().failing_since is not None
    Delivery.objects.filter(pk=delivery_id).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    assert Endpoint.objects.get().failing_since is None
