"""Retention against real PostgreSQL: what goes, what stays, and a manual retry racing the prune.

Whole days past retention are dropped (tests/test_partitions.py has the day's own tests); the batches here are
the default partition's: rows no day partition covers (`_old_events` makes them on a day that has none)."""
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.conftest import create_endpoint, past_todays_partition
from webhooks import ids
from webhooks.models import Delivery, DeliveryAttempt, DeliveryOutbox, Endpoint, Event
from webhooks.delivery.retries import delivery_retry
from webhooks.services.retention import events_prune

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("days_restored")]


def _events(api, count):
    return [api.send_event("invoice.paid", {"n": n})["id"] for n in range(count)]


def _finish(event_ids, status=Delivery.SUCCEEDED):
    """As if every delivery of these events had been sent once and was now final."""
    for delivery in Delivery.objects.filter(event_id__in=event_ids):
        DeliveryAttempt.objects.create(delivery=delivery, number=1, started_at=timezone.now(), duration_ms=3,
                                       response_status=200)
    Delivery.objects.filter(event_id__in=event_ids).update(status=status, attempt_count=1, next_attempt_at=None)
    DeliveryOutbox.objects.filter(delivery__event_id__in=event_ids).delete()


def _old_events(api, count):
    """Events 100 days old, on a day no partition covers (they lie in the default partitions), each with a pending
    delivery to every endpoint of the tenant, as intake would have made them then."""
    when = timezone.now() - timedelta(days=100)
    made = []
    for n in range(count):
        event = Event.objects.create(id=ids.made_at("evt", when + timedelta(milliseconds=n)), tenant=api.tenant,
                                     type="invoice.paid", created_at=when,
                                     payload=b'{"type":"invoice.paid","timestamp":"x","data":{}}')
        for rank, endpoint in enumerate(Endpoint.objects.filter(tenant=api.tenant).order_by("id"), 1):
            Delivery.objects.create(id=f"dlv_{event.id.removeprefix('evt_')}{rank:05}", tenant=api.tenant,
                                    event=event, endpoint=endpoint, next_attempt_at=when)
        made.append(event.id)
    return made


def test_old_final_events_go_with_their_deliveries_and_attempts_and_the_rest_stays(api):
    create_endpoint(api, "https://a.example.com/")
    create_endpoint(api, "https://b.example.com/")
    old, recent = _old_events(api, 5), _events(api, 2)
    _finish(old[:3], Delivery.SUCCEEDED)
    _finish(old[3:4], Delivery.FAILED)
    # old[4] still has its deliveries pending (a retry scheduled)
    _finish(recent)

    pruned = events_prune(batch=2)

    assert (pruned.days, pruned.events, pruned.deliveries, pruned.attempts, pruned.kept) == (0, 4, 8, 8, 1)
    assert pruned.batches == 3  # 2 + 2 + 1 events past the cutoff, two at a time
    remaining = set(Event.objects.values_list("id", flat=True))
    assert remaining == {old[4], *recent}
    assert Delivery.objects.filter(event_id=old[4], status=Delivery.PENDING).count() == 2
    assert DeliveryAttempt.objects.filter(delivery__event_id__in=recent).count() == 4
    assert not DeliveryAttempt.objects.filter(delivery__event_id__in=old).exists()
    # and the API keeps answering about what is left
    assert {e["id"] for e in api.get("events").json()["data"]} >= {old[4], *recent}


def test_an_event_with_one_pending_delivery_is_kept_whole(api):
    create_endpoint(api, "https://a.example.com/")
    create_endpoint(api, "https://b.example.com/")
    (event_id,) = _events(api, 1)
    first, second = Delivery.objects.filter(event_id=event_id).order_by("id")
    _finish([event_id])
    Delivery.objects.filter(pk=second.pk).update(status=Delivery.PENDING)
    pruned = events_prune(now=past_todays_partition())
    assert (pruned.moved, pruned.kept) == (1, 1)  # its day dropped, it moved on, and stays for its pending delivery
    assert Delivery.objects.filter(event_id=event_id).count() == 2
    assert DeliveryAttempt.objects.filter(delivery__event_id=event_id).count() == 2


def test_a_manual_retry_in_progress_during_the_prune_keeps_its_event_and_delivery(api):
    create_endpoint(api, "https://a.example.com/")
    (event_id,) = _events(api, 1)
    _finish([event_id])
    delivery = Delivery.objects.get(event_id=event_id)
    retried, release, done = threading.Event(), threading.Event(), threading.Event()

    def retry_slowly():
        # the real service, in a transaction that stays open until the prune has returned (or 30 s: a prune
        # that waited for the retry's locks returns only after that, and the test fails below)
        try:
            with transaction.atomic():
                assert delivery_retry(delivery=Delivery.objects.get(pk=delivery.pk)).status == Delivery.PENDING
                retried.set()
                release.wait(30)
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=retry_slowly)
    thread.start()
    assert retried.wait(5)
    pruned = events_prune(now=past_todays_partition())  # its day is past retention: a drop, given up
    assert not done.is_set(), "the prune waited for the retry"
    release.set()
    thread.join()
    assert (pruned.events, pruned.deliveries) == (0, 0)
    assert Delivery.objects.get(pk=delivery.pk).status == Delivery.PENDING
    assert Event.objects.filter(pk=event_id).exists()
    # once it is final again, the next run takes it
    Delivery.objects.filter(pk=delivery.pk).update(status=Delivery.SUCCEEDED)
    DeliveryOutbox.objects.filter(delivery_id=delivery.pk).delete()
    assert events_prune(now=past_todays_partition()).events == 1


def test_a_retry_after_the_prune_finds_the_delivery_gone(api):
    create_endpoint(api, "https://a.example.com/")
    (event_id,) = _events(api, 1)
    _finish([event_id])
    delivery = Delivery.objects.get(event_id=event_id)
    assert events_prune(now=past_todays_partition()).events == 1
    response = api.post(f"deliveries/{delivery.pk}/retry")
    assert response.status_code == 404
    # the admin's retry of a delivery it had listed just before counts it as skipped
    from webhooks.admin import DeliveryAdmin

    assert DeliveryAdmin._retried(delivery) is False
