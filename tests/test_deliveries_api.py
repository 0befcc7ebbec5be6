"""The delivery status API: filters, attempts, manual retry and tenant isolation."""
import pytest

from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def deliveries(api):
    a = api.post("endpoints", {"url": "https://a.example.com/"}).json()["id"]
    b = api.post("endpoints", {"url": "https://b.example.com/", "event_types": ["invoice.*"]}).json()["id"]
    paid = api.send_event("invoice.paid")
    created = api.send_event("customer.created")
    return {"a": a, "b": b, "paid": paid, "created": created}


def test_list_and_filters(api, deliveries):
    all_ids = [d["id"] for d in api.get("deliveries").json()["data"]]
    assert len(all_ids) == 3 and all_ids == sorted(all_ids, reverse=True)
    by_endpoint = api.get("deliveries", endpoint=deliveries["b"]).json()["data"]
    assert [d["event_id"] for d in by_endpoint] == [deliveries["paid"]["id"]]
    by_event = api.get("deliveries", event=deliveries["paid"]["id"]).json()["data"]
    assert {d["endpoint_id"] for d in by_event} == {deliveries["a"], deliveries["b"]}
    Delivery.objects.filter(pk=by_event[0]["id"]).update(status=Delivery.FAILED)
    assert [d["id"] for d in api.get("deliveries", status="failed").json()["data"]] == [by_event[0]["id"]]
    assert api.get("deliveries", status="bogus").json()["code"] == "validation_error"


def test_detail_has_the_documented_shape(api, deliveries):
    delivery_id = deliveries["paid"]["deliveries"][0]["id"]
    detail = api.get(f"deliveries/{delivery_id}").json()
    assert {"id", "event_id", "endpoint_id", "status", "attempt_count", "next_attempt_at", "attempts"} <= detail.keys()
    assert detail["status"] == "pending" and detail["attempts"] == [] and detail["attempt_count"] == 0


def test_retry_leaves_a_pending_delivery_as_it_is_and_reopens_a_finished_one(api, deliveries, broker):
    delivery_id = deliveries["paid"]["deliveries"][0]["id"]
    before = Delivery.objects.get(pk=delivery_id)
    published = len(broker.delivery_ids())
    response = api.post(f"deliveries/{delivery_id}/retry")
    assert response.status_code == 202 and response.json()["status"] == "pending"
    assert Delivery.objects.get(pk=delivery_id).next_attempt_at == before.next_attempt_at
    assert len(broker.delivery_ids()) == published

    Delivery.objects.filter(pk=delivery_id).update(status=Delivery.FAILED, next_attempt_at=None)
    response = api.post(f"deliveries/{delivery_id}/retry")
    assert response.status_code == 202 and response.json()["status"] == "pending"
    assert broker.delivery_ids()[-1] == delivery_id
    # the retry is idempotent like every POST
    again = api.post(f"deliveries/{delivery_id}/retry", key="retry-key-0001")
    replay = api.post(f"deliveries/{delivery_id}/retry", key="retry-key-0001")
    assert replay["Idempotent-Replay"] == "true" and replay.content == again.content


def test_another_tenants_deliveries_are_invisible(api, other_api, deliveries):
    delivery_id = deliveries["paid"]["deliveries"][0]["id"]
    assert other_api.get(f"deliveries/{delivery_id}").status_code == 404
    assert other_api.post(f"deliveries/{delivery_id}/retry").status_code == 404
    assert other_api.get("deliveries").json()["data"] == []
