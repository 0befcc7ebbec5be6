"""The delivery service in-process, against a real receiver and PostgreSQL: decisions and claims."""
import contextlib
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryLease, Endpoint
from webhooks.delivery.leases import delivery_claim
from webhooks.engine import delivery_attempt
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


@contextlib.contextmanager
def _hosts_entry(name):
    """Point `name` at an address via /etc/hosts (read by the resolver on every lookup)."""
    with open("/etc/hosts") as f:
        original = f.read()

    def point(address):
        with open("/etc/hosts", "w") as f:
            f.write(original.rstrip("\n") + f"\n{address} {name}\n")

    try:
        yield point
    finally:
        with open("/etc/hosts", "w") as f:
            f.write(original)


def test_a_host_that_resolves_to_loopback_only_at_delivery_time_is_refused(api, receiver, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    name = "rebind.herald-test.example"
    try:
        open("/etc/hosts", "a").close()
    except OSError:
        pytest.fail("this test needs to write /etc/hosts (tests run as root here and in CI)")
    with _hosts_entry(name) as point:
        point("93.184.216.34")  # public at creation time: accepted (nothing is sent there)
        url = f"http://{name}:{receiver.port}/hook"
        response = api.post("endpoints", {"url": url})
        assert response.status_code == 201, response.content
        delivery_id = api.delivery_id("invoice.paid")
        point("127.0.0.1")  # rebinds to loopback before the delivery
        delivery_attempt(delivery_id=delivery_id)
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
