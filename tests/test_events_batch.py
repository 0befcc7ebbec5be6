"""Batch intake (SPEC §4 `POST /events/batch`): many events under one key, all or nothing, in order.

Validation and fan-out through the in-process API; idempotent replay, a platform acting for two tenants
and the Python client's `events.send_batch` against the live API (real gunicorn, a Celery worker).
"""
import json
import uuid

import pytest
from django.db import transaction

import herald_client
from herald_client import Herald, RetryPolicy
from tests.conftest import all_succeeded, create_endpoint, wait_until
from tests.test_client import server  # noqa: F401 - the live API and a worker, started for this module
from tests.test_client_platform import _platform_token
from webhooks.models import Delivery, DeliveryOutbox, Event, EventType
from webhooks.services.events import event_ingest, event_ingest_many

pytestmark = pytest.mark.django_db(transaction=True)


def _counts(tenant) -> tuple[int, int, int]:
    return (Event.objects.filter(tenant=tenant).count(), Delivery.objects.filter(tenant=tenant).count(),
            DeliveryOutbox.objects.filter(delivery__tenant=tenant).count())


def test_a_batch_is_answered_in_order_each_event_as_a_single_post_answers_it(api):
    everything = api.post("endpoints", {"url": "https://all.example.com/"}).json()["id"]
    eu = api.post("endpoints", {"url": "https://eu.example.com/", "channels": ["eu"]}).json()["id"]
    paid = api.post("endpoints", {"url": "https://paid.example.com/", "event_types": ["invoice.*"]}).json()["id"]
    events = [{"type": "invoice.paid", "data": {"n": 0}, "channels": ["eu"]},
              {"type": "customer.created", "data": {"n": 1}},
              {"type": "invoice.voided", "data": [1, 2]},
              {"type": "customer.created", "data": {"n": 3}, "channels": ["us"]}]

    response = api.post("events/batch", {"events": events})

    assert response.status_code == 202, response.content
    answered = response.json()["data"]
    assert [(e["type"], e["data"], e["channels"]) for e in answered] == [
        (e["type"], e["data"], e.get("channels", [])) for e in events]
    assert [sorted(d["endpoint_id"] for d in e["deliveries"]) for e in answered] == [
        sorted([everything, eu, paid]), [everything], sorted([everything, paid]), [everything]]
    ids = [e["id"] for e in answered]
    assert ids == sorted(ids) and len(set(ids)) == 4  # time-ordered as sent: fifo endpoints keep the order
    for event in answered:  # each as GET /events/{id} (and so POST /events) shows it
        single = api.get(f"events/{event['id']}").json()
        assert single == event
    # every non-poll delivery has its outbox row; delivery ids as a single post would make them
    assert _counts(api.tenant) == (4, 7, 7)
    for event in answered:
        assert [d["id"] for d in event["deliveries"]] == sorted(d["id"] for d in event["deliveries"])
        assert all(d["id"].startswith("dlv_" + event["id"][4:]) for d in event["deliveries"])


def test_a_batch_goes_to_filtered_endpoints_only_with_the_events_their_filters_match(api):
    # as POST /events does (SPEC §15): the batch statement matched no filter before (found by review)
    large = api.post("endpoints", {"url": "https://large.example.com/", "filter": {
        "data": {"amount": {"$gte": 1000}}, "channels": "eu"}}).json()["id"]
    plain = api.post("endpoints", {"url": "https://plain.example.com/"}).json()["id"]
    events = [{"type": "invoice.paid", "data": {"amount": 500}, "channels": ["eu"]},
              {"type": "invoice.paid", "data": {"amount": 1500}, "channels": ["eu"]},
              {"type": "invoice.paid", "data": {"amount": 2500}, "channels": ["us"]},
              {"type": "invoice.paid", "data": {"currency": "eur"}, "channels": ["eu"]}]
    response = api.post("events/batch", {"events": events})
    assert response.status_code == 202, response.content
    batched = [sorted(d["endpoint_id"] for d in e["deliveries"]) for e in response.json()["data"]]
    assert batched == [[plain], sorted([large, plain]), [plain], [plain]]
    singly = [sorted(d["endpoint_id"] for d in api.post("events", event).json()["deliveries"]) for event in events]
    assert singly == batched


def test_batch_ingest_is_one_statement_whatever_the_size(api, django_assert_num_queries):
    for n in range(5):
        api.post("endpoints", {"url": f"https://{n}.example.com/"})
    batch = [{"type": "invoice.paid", "data": {"n": n}, "channels": []} for n in range(100)]
    with django_assert_num_queries(3), transaction.atomic():  # BEGIN, the statement, COMMIT
        made = event_ingest_many(tenant=api.tenant, events=batch)
    assert [e.data["n"] for e in made] == list(range(100))
    assert Delivery.objects.filter(event__in=[e.id for e in made]).count() == 500
    # the same delivery ids a single ingest makes: the event's ULID and the endpoint's rank
    with transaction.atomic():
        single = event_ingest(tenant=api.tenant, event_type="invoice.paid", data={}, channels=[])
    assert [d.id[-5:] for d in single.delivery_list] == [d.id[-5:] for d in made[0].delivery_list]


@pytest.mark.parametrize("body, pointers", [
    ({}, ["/events"]),
    ({"events": {}}, ["/events"]),
    ({"events": []}, ["/events"]),
    ({"events": [{"type": "a.b", "data": {}}] * 501}, ["/events"]),
    ({"events": [{"type": "a.b", "data": {}}, {"type": "bad type", "data": {}}, 7,
                 {"type": "a.b", "data": {}, "channels": ["ok", "not ok"]},
                 {"type": "herald.test", "data": {}}, {"type": "a.b"}]},
     ["/events/1/type", "/events/2", "/events/3/channels/1", "/events/4/type", "/events/5/data"]),
])
def test_an_invalid_batch_is_400_keyed_by_json_pointer_and_stores_nothing(api, body, pointers):
    api.post("endpoints", {"url": "https://all.example.com/"})
    response = api.post("events/batch", body)
    assert response.status_code == 400, response.content
    problem = response.json()
    assert response["Content-Type"] == "application/problem+json"
    assert problem["code"] == "validation_error"
    assert sorted(problem["errors"]) == pointers
    assert _counts(api.tenant) == (0, 0, 0)


def test_one_event_against_its_catalog_schema_refuses_the_whole_batch(api, platform_api):
    created = platform_api.post("event-types", {"name": "invoice.paid", "schema": {
        "type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}})
    assert created.status_code == 201, created.content
    api.post("endpoints", {"url": "https://all.example.com/"})
    events = [{"type": "invoice.paid", "data": {"amount": 1}}, {"type": "other.type", "data": {}},
              {"type": "invoice.paid", "data": {"amount": "1"}}, {"type": "invoice.paid", "data": {}}]

    response = api.post("events/batch", {"events": events})

    assert response.status_code == 400, response.content
    assert sorted(response.json()["errors"]) == ["/events/2/data/amount", "/events/3/data/amount"]
    assert _counts(api.tenant) == (0, 0, 0)
    # the good events alone go through
    assert api.post("events/batch", {"events": events[:2]}).status_code == 202
    assert _counts(api.tenant) == (2, 2, 2)
    EventType.objects.filter(name="invoice.paid").delete()


@pytest.fixture
def platform_api(db):
    from tests.test_event_types_api import make_platform_api

    return make_platform_api()


# ------------------------------------------------------------------ against the live API


def test_a_batch_is_replayed_under_its_key_and_delivered(server, api, receiver):  # noqa: F811
    herald = Herald(server.url, api.token, retry=RetryPolicy(base_delay=0.05))
    create_endpoint(api, receiver.url("/hook"))
    events = [{"type": "invoice.paid", "data": {"n": n}} for n in range(20)]
    key = f"batch-{uuid.uuid4()}"

    first = herald.events.send_batch(events, idempotency_key=key)
    again = herald.request("POST", "events/batch", json={"events": events}, idempotency_key=key)

    assert again.replayed and again.json()["data"] == first
    assert [e["data"] for e in first] == [{"n": n} for n in range(20)]
    assert Event.objects.filter(tenant=api.tenant).count() == 20
    delivery_ids = [e["deliveries"][0]["id"] for e in first]
    wait_until(lambda: all_succeeded(delivery_ids), message="every event of the batch delivered")
    assert sorted(json.loads(r.body)["data"]["n"] for r in receiver.requests_to("/hook")) == list(range(20))
    # the same key with other events is refused, and stores nothing
    with pytest.raises(herald_client.IdempotencyKeyReused):
        herald.events.send_batch(events[:3], idempotency_key=key)
    with pytest.raises(herald_client.ValidationError) as refused:
        herald.events.send_batch([*events[:3], {"type": "bad type", "data": {}}])
    assert list(refused.value.errors) == ["/events/3/type"]
    assert Event.objects.filter(tenant=api.tenant).count() == 20
    herald.close()


def test_a_platforms_batch_for_one_tenant_never_touches_another(server):  # noqa: F811
    platform = Herald(server.url, _platform_token(), retry=RetryPolicy(base_delay=0.05))
    mine = platform.tenants.create("Mine", uid=f"mine-{uuid.uuid4().hex[:8]}")
    theirs = platform.tenants.create("Theirs", uid=f"theirs-{uuid.uuid4().hex[:8]}")
    # poll endpoints: deliveries are made, and no worker is still attempting one when the test's database is
    # emptied (a flush racing a worker's write deadlocks)
    their_endpoint = platform.tenant(theirs["id"]).endpoints.create(kind="poll")
    my_endpoint = platform.tenant(mine["uid"]).endpoints.create(kind="poll")
    key = f"batch-{uuid.uuid4()}"

    made = platform.tenant(mine["uid"]).events.send_batch(
        [{"type": "a.b", "data": {"n": n}} for n in range(3)], idempotency_key=key)
    # the same key and body for the other tenant is that tenant's own request (SPEC §10: a platform's keys
    # under /tenants/{t}/ belong to that tenant): executed there, never my answer replayed
    answer = platform.request("POST", f"tenants/{theirs['id']}/events/batch", idempotency_key=key,
                              json={"events": [{"type": "a.b", "data": {"n": n}} for n in range(3)]})
    assert not answer.replayed
    theirs_made = answer.json()["data"]

    assert [d["endpoint_id"] for e in made for d in e["deliveries"]] == [my_endpoint["id"]] * 3
    assert [d["endpoint_id"] for e in theirs_made for d in e["deliveries"]] == [their_endpoint["id"]] * 3
    assert {e["id"] for e in made}.isdisjoint(e["id"] for e in theirs_made)
    assert Event.objects.filter(tenant_id=mine["id"]).count() == 3
    assert Event.objects.filter(tenant_id=theirs["id"]).count() == 3
    # a tenant credential of one tenant cannot name another's path, and an unknown tenant is 404
    with pytest.raises(herald_client.NotFound):
        platform.tenant("nobody-here").events.send_batch([{"type": "a.b", "data": {}}])
    tenant_token = platform.tenant(mine["id"]).credentials.create()["token"]
    with Herald(server.url, tenant_token, retry=RetryPolicy(base_delay=0.05)) as tenant_client:
        with pytest.raises(herald_client.Forbidden):
            tenant_client.request("POST", f"tenants/{theirs['id']}/events/batch",
                                  json={"events": [{"type": "a.b", "data": {}}]})
    assert Event.objects.filter(tenant_id=theirs["id"]).count() == 3
    platform.close()
