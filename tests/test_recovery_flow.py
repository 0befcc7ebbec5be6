"""Recovering an outage end to end (SPEC §11): real Celery workers and beat, real Redis, real receivers.

A receiver is down (answers 500) until every delivery to it has failed for good; it comes back; a
recovery resends them, in event order, a batch at a time, within the endpoint's rules.
"""
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import requests
from django.db import transaction

from tests.conftest import attempts_max_overlap, create_endpoint, wait_until
from tests.processes import celery_beat, celery_worker, free_port, gunicorn
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryOutbox, Event, Recovery, Tenant
from webhooks.services.events import event_ingest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Two attempts per delivery (the first and one retry at once), and no breaker in the way of the outage:
# every delivery fails for good within a second or two.
OUTAGE = {"WEBHOOK_RETRY_SCHEDULE": "0", "WEBHOOK_BREAKER_FAILURES": "100000", "WEBHOOK_RECOVER_POLL_SECONDS": "0.1"}


def _events(api, count: int) -> list[str]:
    ids = []
    for n in range(count):
        response = api.post("events", {"type": "invoice.paid", "data": {"n": n}})
        assert response.status_code == 202, response.content
        ids.append(response.json()["id"])
    return ids


def _failed(endpoint_id: str, count: int, timeout: float = 60) -> None:
    wait_until(lambda: Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.FAILED).count() == count,
               timeout=timeout, message=f"{count} failed deliveries")


def _recovery_done(api, recovery_id: str, timeout: float = 60, seen: list | None = None) -> dict:
    def completed():
        body = api.get(f"recoveries/{recovery_id}").json()
        if seen is not None:
            seen.append(body)
        return body if body["status"] == "completed" else None
    return wait_until(completed, timeout=timeout, interval=0.1, message="the recovery to complete")


def _max_overlap(endpoint_id: str) -> int:
    """The most successful attempts to the endpoint that were in flight at once, as Herald recorded them."""
    from webhooks.models import DeliveryAttempt

    return attempts_max_overlap(DeliveryAttempt.objects.filter(delivery__endpoint_id=endpoint_id, error=""))


def test_after_an_outage_a_recovery_resends_what_failed_in_event_order(api, sink, processes):
    """For every destination kind (the `sink` fixture): a fifo endpoint gets its deliveries back strictly in
    event order; an unordered one batch by batch (batch n+1 only after every delivery of batch n had its
    attempt), within its cap; the progress counts go up to the total; what lies outside [since, until) stays
    failed."""
    from webhooks.models import DeliveryAttempt

    processes(celery_worker("rcv", concurrency=8, WEBHOOK_RECOVER_BATCH="4", **OUTAGE))
    processes(celery_beat(**OUTAGE))
    fifo = create_endpoint(api, **sink.endpoint_fields("/fifo"), ordering="fifo")
    unordered = create_endpoint(api, **sink.endpoint_fields("/many"), max_in_flight=3)
    sink.down("/fifo")
    sink.down("/many")
    before = _events(api, 2)
    time.sleep(0.05)  # the input: the clock moves on, so `since` and `until` fall strictly between the sets
    since = datetime.now(timezone.utc)
    events = _events(api, 16)
    time.sleep(0.05)
    until = datetime.now(timezone.utc)
    after = _events(api, 2)
    _failed(fifo["id"], 20)
    _failed(unordered["id"], 20)
    assert DeliveryAttempt.objects.count() == 80  # two attempts each
    assert sink.received() == []
    sink.up("/fifo")  # back up
    sink.up("/many")

    seen = []
    recoveries = {}
    for endpoint in (fifo, unordered):
        response = api.post(f"endpoints/{endpoint['id']}/recover", {"since": since.isoformat(),
                                                                      "until": until.isoformat()})
        assert response.status_code == 202, response.content
        assert response.json()["total"] == 16 and response.json()["done"] == 0
        recoveries[endpoint["id"]] = response.json()["id"]
    for recovery_id in recoveries.values():
        final = _recovery_done(api, recovery_id, seen=seen)
        assert final["total"] == final["done"] == 16

    to_fifo = [r.headers["webhook-id"] for r in sink.wait_for(16, "/fifo")]
    to_many = [r.headers["webhook-id"] for r in sink.wait_for(16, "/many")]
    assert to_fifo == events  # exactly once each, in event order
    assert sorted(to_many) == events
    batch_of = {event_id: i // 4 for i, event_id in enumerate(events)}
    assert [batch_of[e] for e in to_many] == sorted(batch_of[e] for e in to_many)
    assert _max_overlap(fifo["id"]) == 1
    assert _max_overlap(unordered["id"]) <= 3
    # progress went up in steps, never past the total
    dones = [body["done"] for body in seen if body["id"] == recoveries[unordered["id"]]]
    assert dones == sorted(dones) and max(dones) == 16
    for endpoint in (fifo, unordered):
        statuses = dict(Delivery.objects.filter(endpoint_id=endpoint["id"]).values_list("event_id", "status"))
        assert {statuses[e] for e in events} == {Delivery.SUCCEEDED}
        assert {statuses[e] for e in before + after} == {Delivery.FAILED}


def _seed_failed(tenant: Tenant, endpoint_id: str, count: int, *, start: datetime, span: timedelta) -> list[str]:
    """`count` events spread over `span` from `start`, each with a delivery to the endpoint that failed for
    good (as after an outage), taken out of the outbox; before any worker runs."""
    events = []
    for n in range(count):
        with transaction.atomic():
            events.append(event_ingest(tenant=tenant, event_type="invoice.paid", data={"n": n}, channels=[],
                                       now=start + span * n / count).id)
    Delivery.objects.filter(endpoint_id=endpoint_id).update(status=Delivery.FAILED, attempt_count=8,
                                                            next_attempt_at=None, updated_at=start)
    DeliveryOutbox.objects.filter(delivery__endpoint_id=endpoint_id).delete()
    return events


def test_two_recoveries_at_once_never_send_a_delivery_twice_at_the_same_moment(api, receiver, processes):
    """Two recovers of the same range, posted at the same moment to a live API, driven by two workers: one
    starts, the other is 409 recovery_in_progress; every delivery arrives once, never two copies at once,
    the endpoint's cap holds; a recovery made after it completed finds nothing left to resend."""
    endpoint = create_endpoint(api, receiver.url("/hook"), max_in_flight=5)
    start = datetime.now(timezone.utc) - timedelta(days=1)
    events = _seed_failed(Tenant.objects.get(pk=api.tenant.pk), endpoint["id"], 120, start=start,
                          span=timedelta(hours=20))
    receiver.default_answer = Answer(status=200, delay=0.03)
    env = {**OUTAGE, "WEBHOOK_RECOVER_BATCH": "25"}
    server = processes(gunicorn(free_port(), workers=2, threads=4))
    processes(celery_worker("rcv1", concurrency=10, **env))
    processes(celery_worker("rcv2", concurrency=10, **env))
    processes(celery_beat(**env))

    answers = [None, None]
    go = threading.Barrier(2)

    def recover(i: int) -> None:
        with requests.Session() as client:
            go.wait()
            answers[i] = client.post(f"{server.url}/api/v1/endpoints/{endpoint['id']}/recover", timeout=30,
                                     json={"since": (start - timedelta(minutes=1)).isoformat()},
                                     headers={"Authorization": f"Bearer {api.token}",
                                              "Idempotency-Key": f"recover-{uuid.uuid4()}"})

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(a.status_code for a in answers) == [202, 409], [a.content for a in answers]
    assert [a.json()["code"] for a in answers if a.status_code == 409] == ["recovery_in_progress"]
    started = next(a.json()["id"] for a in answers if a.status_code == 202)
    final = _recovery_done(api, started, timeout=90)

    received = [r.headers["webhook-id"] for r in receiver.received]
    assert sorted(received) == events  # each exactly once
    assert max(receiver.max_in_flight.values()) == 1
    assert receiver.path_max_in_flight["/hook"] <= 5
    assert (final["total"], final["done"]) == (120, 120)
    assert set(Delivery.objects.filter(endpoint_id=endpoint["id"]).values_list("status", flat=True)) == {
        Delivery.SUCCEEDED}
    # completed, the endpoint may be recovered again: nothing is failed any more, nothing is sent again
    again = requests.post(f"{server.url}/api/v1/endpoints/{endpoint['id']}/recover", timeout=30,
                          json={"since": (start - timedelta(minutes=1)).isoformat()},
                          headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": f"recover-{uuid.uuid4()}"})
    assert again.status_code == 202 and again.json()["total"] == 0
    assert _recovery_done(api, again.json()["id"])["done"] == 0
    assert len(receiver.received) == 120
    assert Recovery.objects.filter(status=Recovery.COMPLETED).count() == 2


def test_a_day_of_failed_deliveries_recovers_in_order_within_the_cap(api, receiver, processes, capsys):
    """2,000 deliveries failed over a day (seeded); the receiver is back: all are sent, in batches in event
    order, none twice at once, the cap held, the progress visible; the throughput is reported."""
    endpoint = create_endpoint(api, receiver.url("/hook"), max_in_flight=20)
    start = datetime.now(timezone.utc) - timedelta(days=1, minutes=5)
    events = _seed_failed(Tenant.objects.get(pk=api.tenant.pk), endpoint["id"], 2000, start=start,
                          span=timedelta(days=1))
    processes(celery_worker("rcv", concurrency=None, **OUTAGE))
    processes(celery_beat(**OUTAGE))

    began = time.monotonic()
    response = api.post(f"endpoints/{endpoint['id']}/recover", {"since": start.isoformat()})
    assert response.status_code == 202 and response.json()["total"] == 2000
    seen = []
    final = _recovery_done(api, response.json()["id"], timeout=120, seen=seen)
    elapsed = time.monotonic() - began
    assert final["done"] == 2000
    received = [r.headers["webhook-id"] for r in receiver.received]
    assert sorted(received) == events
    batch_of = {event_id: i // 500 for i, event_id in enumerate(events)}  # WEBHOOK_RECOVER_BATCH
    assert [batch_of[e] for e in received] == sorted(batch_of[e] for e in received)
    assert max(receiver.max_in_flight.values()) == 1
    assert receiver.path_max_in_flight["/hook"] <= 20
    assert len({body["done"] for body in seen}) > 2  # progress was visible along the way
    with capsys.disabled():
        print(f"\nrecovery: 2000 deliveries in {elapsed:.2f} s = {2000 / elapsed:.0f}/s")
    assert Event.objects.filter(pk__in=events).count() == 2000


def test_a_lost_step_is_sent_again_by_beat(api, receiver, processes, broker, settings):
    """The recovery's first step is lost with the broker's queue (a flush): beat's dispatcher finds the
    recovery stalled and sends its step again; it completes, each delivery sent once."""
    endpoint = create_endpoint(api, receiver.url("/hook"))
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    events = _seed_failed(Tenant.objects.get(pk=api.tenant.pk), endpoint["id"], 12, start=start,
                          span=timedelta(hours=1))
    response = api.post(f"endpoints/{endpoint['id']}/recover", {"since": start.isoformat()})
    assert response.status_code == 202
    assert ("webhooks.recovery_step", [response.json()["id"], 0]) in broker.published(settings.HERALD_PERIODIC_QUEUE)
    broker.clear()
    assert broker.published() == []
    processes(celery_worker("rcv", concurrency=4, **OUTAGE))
    processes(celery_beat(**OUTAGE))

    final = _recovery_done(api, response.json()["id"], timeout=40)
    assert final["done"] == final["total"] == 12
    assert sorted(r.headers["webhook-id"] for r in receiver.received) == events
