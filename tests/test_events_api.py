"""Event intake: fan-out rules, one delivery per matching endpoint, enqueue only after commit."""
import time

import pytest
from django.conf import settings
from django.db import transaction

from tests.conftest import wait_until
from webhooks.models import Delivery, DeliveryOutbox, Event
from webhooks.delivery.publishing import doorbell_channel, publisher
from webhooks.delivery.relay import Relay
from webhooks.services.events import event_ingest

pytestmark = pytest.mark.django_db(transaction=True)


def _endpoint(api, url, **extra):
    response = api.post("endpoints", {"url": url, **extra})
    assert response.status_code == 201
    return response.json()["id"]


def test_fan_out_matches_types_prefixes_channels_and_skips_disabled(api, other_api, broker):
    everything = _endpoint(api, "https://all.example.com/")
    exact = _endpoint(api, "https://exact.example.com/", event_types=["invoice.paid"])
    prefix = _endpoint(api, "https://prefix.example.com/", event_types=["invoice.*"])
    _endpoint(api, "https://other-type.example.com/", event_types=["invoice.created", "customer.*"])
    _endpoint(api, "https://not-a-prefix.example.com/", event_types=["invoice.paid.*"])
    eu = _endpoint(api, "https://eu.example.com/", channels=["eu"])
    _endpoint(api, "https://us.example.com/", channels=["us"])
    disabled = _endpoint(api, "https://disabled.example.com/")
    api.patch(f"endpoints/{disabled}", {"enabled": False})
    _endpoint(other_api, "https://someone-else.example.com/")

    response = api.post("events", {"type": "invoice.paid", "data": {"amount": 5}, "channels": ["eu"]})

    assert response.status_code == 202
    event = response.json()
    assert event["id"].startswith("evt_")
    assert response["Location"] == f"/api/v1/events/{event['id']}"
    assert {d["endpoint_id"] for d in event["deliveries"]} == {everything, exact, prefix, eu}
    assert {d["status"] for d in event["deliveries"]} == {"pending"}
    assert sorted(broker.delivery_ids()) == sorted(d["id"] for d in event["deliveries"])


def test_an_event_without_channels_skips_endpoints_that_have_channels(api):
    _endpoint(api, "https://eu.example.com/", channels=["eu"])
    plain = _endpoint(api, "https://plain.example.com/")
    event = api.send_event("a.b")
    assert [d["endpoint_id"] for d in event["deliveries"]] == [plain]


def test_fan_out_to_many_endpoints_is_one_statement(api, django_assert_num_queries):
    for n in range(30):
        _endpoint(api, f"https://{n}.example.com/")
    # BEGIN, one statement for the event, the endpoint match and every delivery, COMMIT
    with django_assert_num_queries(3), transaction.atomic():
        event = event_ingest(tenant=api.tenant, event_type="invoice.paid", data={}, channels=[])
    assert len(event.delivery_list) == 30
    assert Delivery.objects.filter(event_id=event.id).count() == 30
    ids = [d.id for d in event.delivery_list]
    assert len(set(ids)) == 30 and all(i.startswith("dlv_") for i in ids)


def test_a_large_fan_out_is_published_in_messages_of_a_chunk_each(api, broker, settings):
    settings.WEBHOOK_ENQUEUE_CHUNK = 5
    for n in range(12):
        _endpoint(api, f"https://{n}.example.com/")
    event = api.send_event("invoice.paid")
    published = broker.published()
    assert [(task, len(args[0]), args[1]) for task, args in published] == [
        ("webhooks.deliver_many", size, settings.CELERY_TASK_DEFAULT_QUEUE) for size in (5, 5, 2)]
    assert sorted(broker.delivery_ids()) == sorted(d["id"] for d in event["deliveries"])


def test_intake_publishes_nothing_itself_and_a_relay_publishes_many_requests_in_one_message(api, broker):
    _endpoint(api, "https://a.example.com/")
    events = [api.send_event("invoice.paid", {"n": n}) for n in range(4)]
    ids = [e["deliveries"][0]["id"] for e in events]
    assert publisher.flush(5) and broker.redis.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0
    assert DeliveryOutbox.objects.filter(delivery_id__in=ids, published_at__isnull=True).count() == 4
    assert sorted(broker.relay()) == sorted(ids)
    assert [(task, sorted(args[0])) for task, args in broker.published()] == [("webhooks.deliver_many", sorted(ids))]
    assert broker.relay() == []  # published once


def test_the_doorbell_wakes_a_relay_at_once(api, broker, settings):
    settings.WEBHOOK_RELAY_POLL_SECONDS = 30  # no poll would come in time: only the doorbell can
    _endpoint(api, "https://a.example.com/")
    relay = Relay()
    try:
        # Redis says when the relay listens for the doorbell; the relay's first poll is 30 s away
        wait_until(lambda: broker.redis.pubsub_numsub(doorbell_channel())[0][1], timeout=20,
                   message="the relay subscribed to the doorbell")
        started = time.monotonic()
        event = api.send_event("invoice.paid")
        wait_until(lambda: broker.redis.llen(settings.CELERY_TASK_DEFAULT_QUEUE), timeout=20,
                   message="the relay published the delivery")
        # long before the relay's poll could have come (30 s after it started): the doorbell woke it
        assert time.monotonic() - started < settings.WEBHOOK_RELAY_POLL_SECONDS - 5
    finally:
        relay.stop()
    assert broker.delivery_ids() == [event["deliveries"][0]["id"]]


def test_enqueue_happens_after_commit_and_never_after_rollback(api, broker):
    _endpoint(api, "https://a.example.com/")
    # inside the transaction nothing is published yet
    with transaction.atomic():
        event = event_ingest(tenant=api.tenant, event_type="invoice.paid", data={}, channels=[])
        assert broker.delivery_ids() == []
    assert broker.delivery_ids() == [event.delivery_list[0].id]

    # a rolled-back intake publishes nothing
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        event_ingest(tenant=api.tenant, event_type="invoice.paid", data={}, channels=[])
        raise Boom
    assert broker.delivery_ids() == [event.delivery_list[0].id]
    assert Event.objects.count() == 1


def test_event_payload_is_built_once_as_the_webhook_body(api):
    event = api.send_event("invoice.paid", {"b": 1, "a": [1, 2]})
    stored = bytes(Event.objects.get(pk=event["id"]).payload)
    assert stored.startswith(b'{"type":"invoice.paid","timestamp":"')
    assert stored.endswith(b'"data":{"b":1,"a":[1,2]}}')


def test_get_events_with_delivery_statuses_and_type_filter(api, other_api):
    endpoint = _endpoint(api, "https://a.example.com/")
    paid = api.send_event("invoice.paid", {"n": 1})
    created = api.send_event("customer.created", {"n": 2})
    Delivery.objects.filter(event_id=paid["id"]).update(status=Delivery.SUCCEEDED)

    listed = api.get("events").json()
    assert [e["id"] for e in listed["data"]] == [created["id"], paid["id"]]
    one = api.get(f"events/{paid['id']}").json()
    assert one["data"] == {"n": 1}
    assert one["deliveries"] == [{"id": paid["deliveries"][0]["id"], "endpoint_id": endpoint, "status": "succeeded"}]
    assert [e["id"] for e in api.get("events", type="customer.created").json()["data"]] == [created["id"]]
    assert other_api.get(f"events/{paid['id']}").status_code == 404
    assert other_api.get("events").json()["data"] == []


@pytest.mark.parametrize("body", [{"data": {}}, {"type": "invoice.paid"}, {"type": "", "data": {}},
                                  {"type": "invoice..paid", "data": {}}, {"type": "invoice paid", "data": {}},
                                  {"type": "a.b", "data": {}, "channels": "eu"}, ["not", "an", "object"],
                                  {"type": "herald.endpoint.tripped", "data": {}}, {"type": "herald.test", "data": {}}])
def test_invalid_events_are_400_and_store_nothing(api, body, broker):
    _endpoint(api, "https://a.example.com/")
    response = api.post("events", body)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert not Event.objects.exists()
    assert broker.delivery_ids() == []


def test_an_event_renders_exactly_as_drfs_fields_would_render_it(api):
    """EventOutput builds its dict directly; DRF's field-by-field rendering must give the same."""
    from rest_framework import serializers

    from intake.serializers import EventOutput

    _endpoint(api, "https://a.example.com/")
    _endpoint(api, "https://eu.example.com/", channels=["eu"])
    posted = api.send_event("invoice.paid", {"n": [1, {"b": None}], "é": "ü"}, channels=["eu"])
    for event in (Event.objects.get(pk=posted["id"]),  # read back, deliveries from the database
                  event_ingest(tenant=api.tenant, event_type="a.b", data=[1, 2], channels=[])):  # fresh
        fast = EventOutput(event).data
        by_fields = serializers.Serializer.to_representation(EventOutput(event), event)
        assert fast == dict(by_fields) and list(fast) == list(by_fields)
    assert api.get(f"events/{posted['id']}").json() == posted


def test_with_the_doorbell_down_a_relay_still_publishes_by_polling(api, broker, settings, monkeypatch, caplog):
    from webhooks.delivery import publishing

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: every ring fails
    settings.WEBHOOK_RELAY_POLL_SECONDS = 0.5
    monkeypatch.setattr(publishing, "_redis_clients", {})
    _endpoint(api, "https://a.example.com/")
    relay = Relay()
    try:
        event = api.send_event("invoice.paid")
        assert event["deliveries"]  # the client got its 202 regardless
        wait_until(lambda: broker.redis.llen(settings.CELERY_TASK_DEFAULT_QUEUE), timeout=5,
                   message="the relay published the delivery by polling")
    finally:
        relay.stop()
    assert broker.delivery_ids() == [event["deliveries"][0]["id"]]
    assert any(r.message in ("relay.doorbell_failed", "relay.doorbell_unavailable") for r in caplog.records)
