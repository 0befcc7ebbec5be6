"""Polling endpoints (SPEC §12): messages served in order with the headers and body a POST would carry,
acknowledged by cursor; never claimed for HTTP. In-process against real PostgreSQL, Redis and a real
receiver; the long-poll through real gunicorn processes is in test_polling_live.py."""
import json

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks import Webhook

from tests.conftest import create_endpoint, wait_until
from webhooks.models import Delivery, DeliveryOutbox, Endpoint, Event
from webhooks.delivery.dispatcher import deliveries_dispatch_due
from webhooks.delivery.claim import deliveries_claim

pytestmark = pytest.mark.django_db(transaction=True)


def poll_endpoint(api, **extra) -> dict:
    response = api.post("endpoints", {"kind": "poll", **extra})
    assert response.status_code == 201, response.content
    endpoint = response.json()
    return {**endpoint, "secret": api.get(f"endpoints/{endpoint['id']}/secret").json()["secret"]}


def post_events(api, count, event_type="invoice.paid"):
    return [api.send_event(event_type, {"n": n, "text": "é ✓"}) for n in range(count)]


def messages(api, endpoint, **params):
    response = api.get(f"endpoints/{endpoint['id']}/messages", **params)
    assert response.status_code == 200, response.content
    return response.json()


def attempts_succeeded() -> float:
    text = Client().get("/metrics").content.decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "herald_delivery_attempts_total" and sample.labels["outcome"] == "success")


def test_a_poll_endpoint_is_created_without_a_url_and_says_its_kind(api):
    endpoint = poll_endpoint(api, event_types=["invoice.*"])
    assert endpoint["kind"] == "poll" and endpoint["url"] is None
    assert api.get(f"endpoints/{endpoint['id']}").json()["kind"] == "poll"
    http = create_endpoint(api, "https://hooks.example.com/x")
    assert http["kind"] == "http" and http["url"] == "https://hooks.example.com/x"


@pytest.mark.parametrize("body,field", [
    ({"kind": "poll", "url": "https://hooks.example.com/x"}, "url"),
    ({"kind": "http"}, "url"),
    ({}, "url"),
    ({"kind": "websocket"}, "kind"),
])
def test_a_poll_endpoint_with_a_url_or_an_http_one_without_is_refused(api, body, field):
    response = api.post("endpoints", body)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "validation_error" and field in response.json()["errors"]
    assert not Endpoint.objects.exists()


def test_a_poll_endpoint_cannot_be_given_a_url_nor_change_its_kind(api):
    endpoint = poll_endpoint(api)
    response = api.patch(f"endpoints/{endpoint['id']}", {"url": "https://hooks.example.com/x"})
    assert response.status_code == 400 and "url" in response.json()["errors"]
    api.patch(f"endpoints/{endpoint['id']}", {"kind": "http", "description": "d"})
    assert Endpoint.objects.get(pk=endpoint["id"]).kind == "poll" and not Endpoint.objects.get().url


def test_messages_verify_with_standardwebhooks_and_come_in_event_order_byte_for_byte(api):
    endpoint = poll_endpoint(api)
    events = post_events(api, 5)
    page = messages(api, endpoint)
    assert [m["delivery_id"] for m in page["data"]] == [e["deliveries"][0]["id"] for e in events]
    verifier = Webhook(endpoint["secret"])
    for message, event in zip(page["data"], events):
        body = message["body"].encode()
        assert body == bytes(Event.objects.get(pk=event["id"]).payload)  # what a POST carries
        assert verifier.verify(body, message["headers"]) == {
            "type": "invoice.paid", "timestamp": json.loads(body)["timestamp"], "data": event["data"]}
        assert message["headers"]["webhook-id"] == event["id"]
        assert message["headers"]["content-type"] == "application/json"
        assert message["headers"]["user-agent"].startswith("Herald/")
    # a rotated secret: both sign, as they would on a POST
    api.post(f"endpoints/{endpoint['id']}/rotate-secret")
    new_secret = api.get(f"endpoints/{endpoint['id']}/secret").json()["secret"]
    again = messages(api, endpoint, limit=1)["data"][0]
    assert len(again["headers"]["webhook-signature"].split(" ")) == 2
    Webhook(new_secret).verify(again["body"].encode(), again["headers"])
    Webhook(endpoint["secret"]).verify(again["body"].encode(), again["headers"])


def test_a_poll_endpoint_gets_no_post_and_its_deliveries_are_never_claimed(api, receiver, broker, engine):
    # given an HTTP endpoint and a poll endpoint that both take the event
    http = create_endpoint(api, receiver.url("/http"))
    poll = poll_endpoint(api)
    event = post_events(api, 1)[0]
    by_endpoint = {d["endpoint_id"]: d["id"] for d in event["deliveries"]}
    polled = by_endpoint[poll["id"]]
    # then only the HTTP one's delivery is published, and a worker's engine delivers it
    assert broker.delivery_ids() == [by_endpoint[http["id"]]]
    # (even a message naming the poll endpoint's delivery, as a bug might publish, sends nothing)
    for delivery_id in [by_endpoint[http["id"]], polled]:
        engine.submit(delivery_id)
    wait_until(lambda: Delivery.objects.get(pk=by_endpoint[http["id"]]).status == "succeeded")
    # the poll endpoint's delivery is pending, with no outbox row and no time due: the claim never takes it,
    # the dispatcher never publishes it
    delivery = Delivery.objects.get(pk=polled)
    assert delivery.status == "pending" and delivery.next_attempt_at is None
    assert not DeliveryOutbox.objects.filter(delivery_id=polled).exists()
    assert deliveries_claim(delivery_ids=[polled]).claims == {}
    assert polled not in deliveries_dispatch_due()
    assert Delivery.objects.get(pk=polled).attempt_count == 0
    assert [r.path for r in receiver.received] == ["/http"]


def test_reading_after_a_cursor_acknowledges_what_was_served_up_to_it(api):
    endpoint = poll_endpoint(api)
    events = post_events(api, 5)
    ids = [e["deliveries"][0]["id"] for e in events]
    before = attempts_succeeded()
    first = messages(api, endpoint, limit=2)
    assert [m["delivery_id"] for m in first["data"]] == ids[:2]
    # reading the same page again (no cursor) serves it again: nothing is acknowledged by reading (signed anew: its
    # timestamp and signature are the new read's own, whichever second it falls in)
    again = messages(api, endpoint, limit=2)
    assert again == {**first, "data": [
        {**m, "headers": {**m["headers"], "webhook-timestamp": n["headers"]["webhook-timestamp"],
                          "webhook-signature": n["headers"]["webhook-signature"]}}
        for m, n in zip(first["data"], again["data"])]}
    assert Delivery.objects.filter(pk__in=ids, status="pending").count() == 5

    second = messages(api, endpoint, after=first["next_cursor"], limit=2)
    assert [m["delivery_id"] for m in second["data"]] == ids[2:4]
    for delivery_id in ids[:2]:
        shown = api.get(f"deliveries/{delivery_id}").json()
        assert shown["status"] == "succeeded" and shown["attempt_count"] == 1
        assert [(a["number"], a["response_status"], a["error"]) for a in shown["attempts"]] == [(1, None, "")]
    pending = [d["id"] for d in api.get("deliveries", status="pending", endpoint=endpoint["id"]).json()["data"]]
    assert sorted(pending) == sorted(ids[2:])
    assert attempts_succeeded() == before + 2  # counted like any delivered attempt

    last = messages(api, endpoint, after=second["next_cursor"])
    assert [m["delivery_id"] for m in last["data"]] == ids[4:]
    end = messages(api, endpoint, after=last["next_cursor"])
    assert end == {"data": [], "next_cursor": last["next_cursor"]}
    assert Delivery.objects.filter(pk__in=ids, status="succeeded").count() == 5
    assert attempts_succeeded() == before + 5


def test_an_event_committed_late_is_served_after_the_cursor_never_acknowledged_unseen(api):
    # given a message served (cursor C), then an event whose id sorts before it (made earlier, committed later)
    endpoint = poll_endpoint(api)
    late_id = None
    from webhooks import ids as id_module

    late_id = id_module.event_id()
    post_events(api, 1)
    page = messages(api, endpoint)
    from webhooks.services.events import event_ingest

    original = id_module.event_id
    id_module.event_id = lambda: late_id
    try:
        late = event_ingest(tenant=api.tenant, event_type="invoice.late", data={}, channels=[])
    finally:
        id_module.event_id = original
    assert late.delivery_list[0].id < page["data"][0]["delivery_id"]
    # when the consumer reads on from C, the late one is served, not acknowledged
    following = messages(api, endpoint, after=page["next_cursor"])
    assert [m["delivery_id"] for m in following["data"]] == [late.delivery_list[0].id]
    assert Delivery.objects.get(pk=late.delivery_list[0].id).status == "pending"


def test_a_retried_delivery_is_served_again(api):
    endpoint = poll_endpoint(api)
    events = post_events(api, 2)
    page = messages(api, endpoint)
    done = messages(api, endpoint, after=page["next_cursor"])
    assert done["data"] == [] and Delivery.objects.filter(status="succeeded").count() == 2
    first = events[0]["deliveries"][0]["id"]
    assert api.post(f"deliveries/{first}/retry").status_code == 202
    delivery = Delivery.objects.get(pk=first)
    assert delivery.status == "pending" and delivery.next_attempt_at is None
    assert not DeliveryOutbox.objects.filter(delivery_id=first).exists()
    again = messages(api, endpoint, after=done["next_cursor"])
    assert [m["delivery_id"] for m in again["data"]] == [first]
    messages(api, endpoint, after=again["next_cursor"])
    shown = api.get(f"deliveries/{first}").json()
    assert shown["status"] == "succeeded" and [a["number"] for a in shown["attempts"]] == [1, 2]


def test_deleting_a_poll_endpoint_cancels_what_it_had_not_acknowledged(api):
    endpoint = poll_endpoint(api)
    ids = [e["deliveries"][0]["id"] for e in post_events(api, 2)]
    assert api.delete(f"endpoints/{endpoint['id']}").status_code == 204
    assert set(Delivery.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"cancelled"}
    assert api.get(f"endpoints/{endpoint['id']}/messages").status_code == 404


@pytest.mark.parametrize("params,field", [
    ({"wait": "31"}, "wait"),
    ({"wait": "-1"}, "wait"),
    ({"wait": "soon"}, "wait"),
    ({"after": "abc"}, "after"),
    ({"after": "-1"}, "after"),
    ({"after": "9" * 19}, "after"),
    ({"after": "1" * 40}, "after"),
    ({"limit": "0"}, "limit"),
    ({"limit": "101"}, "limit"),
])
def test_bad_parameters_are_refused_and_acknowledge_nothing(api, params, field):
    endpoint = poll_endpoint(api)
    post_events(api, 1)
    page = messages(api, endpoint)
    response = api.get(f"endpoints/{endpoint['id']}/messages", **params, **(
        {} if "after" in params else {"after": page["next_cursor"]}))
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "validation_error" and field in response.json()["errors"]
    assert Delivery.objects.get().status == "pending"


def test_an_http_endpoint_has_no_messages_and_another_tenants_poll_endpoint_is_not_found(api, other_api):
    http = create_endpoint(api, "https://hooks.example.com/x")
    response = api.get(f"endpoints/{http['id']}/messages")
    assert response.status_code == 400 and response.json()["code"] == "validation_error"
    endpoint = poll_endpoint(api)
    assert other_api.get(f"endpoints/{endpoint['id']}/messages").status_code == 404


def test_where_the_worker_cannot_park_a_wait_holds_its_thread_and_only_POLL_THREAD_WAITERS_do(api, settings):
    """Another WSGI server (here Django's test client): the wait happens on the request's thread,
    re-reading every POLL_THREAD_RECHECK_SECONDS, and only POLL_THREAD_WAITERS (1) at once; the rest are
    answered at once."""
    import threading
    import time

    from django.db import connection

    settings.POLL_THREAD_RECHECK_SECONDS = 0.1
    endpoint = poll_endpoint(api)
    results = {}

    def wait_in_thread(name, wait):
        started = time.monotonic()
        try:
            results[name] = (messages(api, endpoint, wait=wait), time.monotonic() - started)
        finally:
            connection.close()

    from intake import views

    first = threading.Thread(target=wait_in_thread, args=("first", 30))
    first.start()
    # the one waiter's place is taken once the first wait holds the view's semaphore (its count reads 0)
    wait_until(lambda: views._thread_waiters._value == 0, timeout=20, message="the first wait holding its place")
    wait_in_thread("second", 30)   # answered at once, empty: not after its 30 s wait
    assert results["second"][0]["data"] == [] and results["second"][1] < 15
    event = post_events(api, 1)[0]
    first.join(60)
    page, elapsed = results["first"]
    # the message, well before the wait's 30 s deadline (at which it would have answered an empty page)
    assert [m["headers"]["webhook-id"] for m in page["data"]] == [event["id"]] and elapsed < 15
    started = time.monotonic()
    assert messages(api, endpoint, after=page["next_cursor"], wait=0.5)["data"] == []
    assert time.monotonic() - started >= 0.45  # waited its wait (the upper bound is the test's timeout)
