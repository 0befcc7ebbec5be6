"""Delivery end to end with a real Celery worker, real beat, real Redis and a real receiver; the scenarios that
take a `sink` run once per destination kind (a receiver, or RabbitMQ, Redis or NATS: tests/sinks.py)."""
import json

import pytest
from standardwebhooks import Webhook

from tests.conftest import create_endpoint, wait_until
from tests.processes import celery_beat, celery_worker
from webhooks.models import Delivery, Endpoint, Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker):
    processes = [celery_worker("flows", concurrency=1), celery_beat()]
    yield processes[0]
    for process in processes:
        process.stop()


def _endpoint(api, receiver, path="/hook", **extra):
    if hasattr(receiver, "endpoint_fields"):  # a sink
        return create_endpoint(api, **receiver.endpoint_fields(path), **extra)
    return create_endpoint(api, receiver.url(path), **extra)


def _event(api, data=None):
    return api.send_event("invoice.paid", data or {"invoice": "in_1"})


def _a_later_retry_arrived(api, receiver):
    """The positive marker for "nothing more comes": a later event, for an endpoint of its own that fails
    once, retried through the same worker, beat's dispatcher and retry step as a retry of anything earlier
    would be. Once its retry has arrived, an earlier retry (due sooner) would have arrived before it."""
    create_endpoint(api, receiver.url("/marker"), event_types=["marker.*"])
    receiver.script("/marker", 500, 200)
    api.send_event("marker.sent")
    receiver.wait_for(2, "/marker", timeout=60)


def _status(api, delivery_id, *wanted):
    detail = api.get(f"deliveries/{delivery_id}").json()
    return detail if detail["status"] in wanted else None


def test_a_delivered_webhook_verifies_with_standardwebhooks(api, sink, worker):
    endpoint = _endpoint(api, sink)
    response = api.post("events", {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 4200}},
                        headers={"X-Request-Id": "trace-abc-123456"})
    assert response["X-Request-Id"] == "trace-abc-123456"
    event = response.json()
    (request,) = sink.wait_for(1)

    payload = Webhook(endpoint["secret"]).verify(request.body, request.headers)
    assert payload["data"] == {"invoice": "in_1", "amount": 4200}
    assert payload["type"] == "invoice.paid"
    assert request.headers["webhook-id"] == event["id"]
    if sink.kind == "http":
        assert request.headers["user-agent"].startswith("Herald/")
    assert request.headers["content-type"] == "application/json"
    assert request.body == bytes(Event.objects.get(pk=event["id"]).payload)
    detail = wait_until(lambda: _status(api, event["deliveries"][0]["id"], "succeeded"))
    assert detail["attempt_count"] == 1 and detail["next_attempt_at"] is None
    status = 200 if sink.kind == "http" else None  # a broker's answer is its confirm, ack or entry id
    assert [(a["number"], a["response_status"], a["error"]) for a in detail["attempts"]] == [(1, status, "")]
    # the worker's JSON log line for this delivery carries the intake request's id
    lines = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    attempt_lines = [line for line in lines if line.get("message") == "delivery.attempt"
                     and line.get("event_id") == event["id"]]
    assert [line["request_id"] for line in attempt_lines] == ["trace-abc-123456"]


def test_during_rotation_both_secrets_sign(api, receiver, worker):
    endpoint = _endpoint(api, receiver)
    assert api.post(f"endpoints/{endpoint['id']}/rotate-secret").status_code == 200
    new_secret = api.get(f"endpoints/{endpoint['id']}/secret").json()["secret"]
    assert new_secret != endpoint["secret"]
    _event(api)
    (request,) = receiver.wait_for(1)
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (endpoint["secret"], new_secret):
        Webhook(secret).verify(request.body, request.headers)


def test_500_500_200_is_three_attempts_with_the_same_id_and_bytes(api, receiver, worker):
    _endpoint(api, receiver)
    receiver.script("/hook", 500, 500, 200)
    event = _event(api)
    requests = receiver.wait_for(3)
    detail = wait_until(lambda: _status(api, event["deliveries"][0]["id"], "succeeded"))
    assert [(a["number"], a["response_status"]) for a in detail["attempts"]] == [(1, 500), (2, 500), (3, 200)]
    assert detail["attempt_count"] == 3
    assert len({r.headers["webhook-id"] for r in requests}) == 1
    assert len({r.body for r in requests}) == 1
    # the retry schedule (1 s steps in tests) separates the attempts
    assert requests[1].at - requests[0].at >= 0.9 and requests[2].at - requests[1].at >= 0.9


def test_exhausted_schedule_fails_and_a_manual_retry_succeeds(api, sink, worker):
    _endpoint(api, sink)
    sink.down("/hook")  # four attempts: the first and three retries
    event = _event(api)
    delivery_id = event["deliveries"][0]["id"]
    detail = wait_until(lambda: _status(api, delivery_id, "failed"))
    assert detail["attempt_count"] == 4 and detail["next_attempt_at"] is None
    if sink.kind == "http":
        assert [a["response_status"] for a in detail["attempts"]] == [500, 500, 500, 500]
    else:
        assert all(a["error"].startswith("connection_error") for a in detail["attempts"]), detail["attempts"]
    assert [d["status"] for d in api.get(f"events/{event['id']}").json()["deliveries"]] == ["failed"]

    sink.up("/hook")
    retried = api.post(f"deliveries/{delivery_id}/retry")
    assert retried.status_code == 202 and retried.json()["status"] == "pending"
    detail = wait_until(lambda: _status(api, delivery_id, "succeeded"))
    assert len(detail["attempts"]) == 5 and detail["attempts"][-1]["error"] == ""
    assert len(sink.wait_for(1, "/hook")) == 1


def test_410_disables_the_endpoint_and_stops_attempts(api, receiver, worker):
    endpoint = _endpoint(api, receiver)
    receiver.script("/hook", 410)
    event = _event(api)
    detail = wait_until(lambda: _status(api, event["deliveries"][0]["id"], "failed"))
    assert [a["response_status"] for a in detail["attempts"]] == [410]
    assert api.get(f"endpoints/{endpoint['id']}").json()["enabled"] is False
    # a later event no longer goes there, and no retry of the first one comes
    assert _event(api)["deliveries"] == []
    _a_later_retry_arrived(api, receiver)
    assert len(receiver.requests_to("/hook")) == 1


def test_a_hanging_receiver_is_a_timed_out_attempt_and_frees_the_worker(api, sink, worker):
    from webhooks.models import DeliveryLease

    _endpoint(api, sink, "/slow", event_types=["invoice.*"])
    fast = _endpoint(api, sink, "/fast", event_types=["customer.created"])
    sink.hang("/slow")
    slow_event = _event(api)
    wait_until(lambda: DeliveryLease.objects.filter(delivery_id=slow_event["deliveries"][0]["id"]).exists(),
               message="the slow delivery's attempt to start")
    fast_event = api.send_event("customer.created")
    assert fast_event["deliveries"][0]["endpoint_id"] == fast["id"]
    # the one-process worker is back well before the receiver would have answered
    detail = wait_until(lambda: _status(api, fast_event["deliveries"][0]["id"], "succeeded"), timeout=8)
    assert detail["attempts"][0]["error"] == ""
    slow = api.get(f"deliveries/{slow_event['deliveries'][0]['id']}").json()
    (attempt,) = slow["attempts"]
    assert attempt["response_status"] is None and "timeout" in attempt["error"]
    assert 1900 <= attempt["duration_ms"] < 9000  # cut at WEBHOOK_TIMEOUT_SECONDS (2 in tests), not at the 10 s answer
    assert slow["status"] == "pending"


def test_a_redirect_is_a_failed_attempt_and_is_not_followed(api, receiver, worker):
    from tests.receiver import Answer

    _endpoint(api, receiver, "/moved")
    receiver.script("/moved", Answer(status=302, headers=(("Location", receiver.url("/target")),)))
    event = _event(api)
    receiver.wait_for(1, "/moved")
    detail = wait_until(lambda: api.get(f"deliveries/{event['deliveries'][0]['id']}").json()["attempts"])
    assert detail[0]["response_status"] == 302
    assert "redirect" in detail[0]["error"]
    assert receiver.requests_to("/target") == []
    assert Delivery.objects.get(pk=event["deliveries"][0]["id"]).status == Delivery.PENDING


def test_deleting_the_endpoint_cancels_what_is_still_pending(api, receiver, worker):
    endpoint = _endpoint(api, receiver)
    receiver.script("/hook", 500)
    event = _event(api)
    receiver.wait_for(1)
    assert api.delete(f"endpoints/{endpoint['id']}").status_code == 204
    assert Delivery.objects.get(pk=event["deliveries"][0]["id"]).status == Delivery.CANCELLED
    _a_later_retry_arrived(api, receiver)
    assert len(receiver.requests_to("/hook")) == 1
    assert Endpoint.objects.filter(pk=endpoint["id"], deleted_at__isnull=False).exists()


def test_a_large_fan_out_reaches_every_endpoint(api, sink, worker):
    for n in range(12):  # more than WEBHOOK_INLINE_ENQUEUE_MAX: published by the worker
        _endpoint(api, sink, f"/fan/{n}")
    event = _event(api)
    sink.wait_for(12)
    assert sorted(r.path for r in sink.received()) == sorted(f"/fan/{n}" for n in range(12))
    assert {r.headers["webhook-id"] for r in sink.received()} == {event["id"]}
