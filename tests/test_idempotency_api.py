"""The idempotency contract (SPEC §3) through the real middleware, views and PostgreSQL."""
import json
import logging
from datetime import timedelta

import pytest
from django.http import HttpResponse
from django.utils import timezone

from intake.idempotency.middleware import _stored_response
from intake.models import IdempotencyKey
from webhooks.models import Delivery, Event

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 1200}}


@pytest.fixture
def endpoints(api):
    for url in ("https://a.example.com/hook", "https://b.example.com/hook"):
        assert api.post("endpoints", {"url": url}).status_code == 201
    return api


def test_replay_returns_the_stored_answer_byte_for_byte_and_executes_nothing(endpoints, broker):
    # given a first request that executed
    first = endpoints.post("events", EVENT, key="replay-key-0001")
    assert first.status_code == 202
    assert Event.objects.count() == 1 and Delivery.objects.count() == 2
    published = broker.delivery_ids()
    assert len(published) == 2

    # when the client retries with the same key and request
    again = endpoints.post("events", EVENT, key="replay-key-0001")

    # then it gets the same status, bytes and headers, marked as a replay, and nothing ran
    assert again.status_code == 202
    assert again.content == first.content
    assert again["Idempotent-Replay"] == "true"
    assert again["Location"] == first["Location"]
    assert again["Content-Type"] == first["Content-Type"]
    assert "Idempotent-Replay" not in first
    assert Event.objects.count() == 1 and Delivery.objects.count() == 2
    assert broker.delivery_ids() == published


def test_reordered_json_is_the_same_request(api):
    first = api.post("events", raw='{"type":"invoice.paid","data":{"a":1,"b":2}}', key="canonical-0001")
    again = api.post("events", raw='{ "data": {"b": 2, "a": 1},\n "type": "invoice.paid" }', key="canonical-0001")
    assert first.status_code == 202
    assert again["Idempotent-Replay"] == "true"
    assert again.content == first.content
    assert Event.objects.count() == 1


@pytest.mark.parametrize("mismatch_status", [409, 422])
def test_same_key_with_a_different_body_path_or_method_is_a_mismatch(api, settings, mismatch_status):
    settings.IDEMPOTENCY_MISMATCH_STATUS = mismatch_status
    first = api.post("events", EVENT, key="mismatch-0001")
    assert first.status_code == 202
    endpoint = api.post("endpoints", {"url": "https://a.example.com/"}).json()

    other_body = api.post("events", {**EVENT, "data": {"invoice": "in_2"}}, key="mismatch-0001")
    other_path = api.post("endpoints", {"url": "https://a.example.com/"}, key="mismatch-0001")
    other_query = api.post("events?x=1", EVENT, key="mismatch-0001")
    other_method = api.patch(f"endpoints/{endpoint['id']}", {"description": "x"}, key="mismatch-0001")

    for response in (other_body, other_path, other_query, other_method):
        assert response.status_code == mismatch_status
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "idempotency_key_reused"
    assert Event.objects.count() == 1
    assert IdempotencyKey.objects.get(key="mismatch-0001").response_status == 202


def test_view_exception_persists_nothing_releases_the_key_and_the_retry_executes(api, broker, monkeypatch):
    from intake import serializers

    api.post("endpoints", {"url": "https://a.example.com/"})

    def explode(self, instance):  # fails after the event and its delivery were written
        raise RuntimeError("rendering blew up")

    with monkeypatch.context() as patch:
        patch.setattr(serializers.EventOutput, "to_representation", explode)
        failed = api.post("events", EVENT, key="exception-0001")
    assert failed.status_code == 500
    assert Event.objects.count() == 0 and Delivery.objects.count() == 0
    assert not IdempotencyKey.objects.filter(key="exception-0001").exists()
    assert broker.delivery_ids() == []

    retried = api.post("events", EVENT, key="exception-0001")
    assert retried.status_code == 202
    assert "Idempotent-Replay" not in retried
    assert Event.objects.count() == 1
    assert broker.delivery_ids() == [retried.json()["deliveries"][0]["id"]]


def test_a_4xx_of_the_view_is_stored_and_replayed(api):
    bad = {"type": "not a type!", "data": {}}
    first = api.post("events", bad, key="validation-0001")
    assert first.status_code == 400
    assert first.json()["code"] == "validation_error"
    assert "type" in first.json()["errors"]
    again = api.post("events", bad, key="validation-0001")
    assert again.status_code == 400
    assert again.content == first.content
    assert again["Idempotent-Replay"] == "true"
    assert Event.objects.count() == 0


def test_same_key_under_two_credentials_executes_twice(api, other_api):
    a = api.post("events", EVENT, key="shared-key-0001")
    b = other_api.post("events", EVENT, key="shared-key-0001")
    assert a.status_code == b.status_code == 202
    assert "Idempotent-Replay" not in b
    assert a.json()["id"] != b.json()["id"]
    assert Event.objects.filter(tenant=api.tenant).count() == 1
    assert Event.objects.filter(tenant=other_api.tenant).count() == 1


def test_an_expired_key_is_treated_as_new_even_before_it_is_pruned(api):
    first = api.post("events", EVENT, key="expiring-0001")
    IdempotencyKey.objects.filter(key="expiring-0001").update(expires_at=timezone.now() - timedelta(seconds=1))
    # a different body too: an expired key is forgotten, not compared
    again = api.post("events", {**EVENT, "data": {"x": 1}}, key="expiring-0001")
    assert again.status_code == 202
    assert "Idempotent-Replay" not in again
    assert again.json()["id"] != first.json()["id"]
    assert Event.objects.count() == 2
    key = IdempotencyKey.objects.get(key="expiring-0001")
    assert key.expires_at > timezone.now() + timedelta(hours=23)


def test_a_quoted_structured_field_key_is_the_same_key(api):
    first = api.post("events", EVENT, key="plain-key-0001")
    again = api.post("events", EVENT, key='"plain-key-0001"')
    assert again["Idempotent-Replay"] == "true"
    assert again.content == first.content


def test_replays_and_conflicts_are_logged_as_one_structured_line(api, caplog):
    api.post("events", EVENT, key="logged-key-0001")
    with caplog.at_level(logging.INFO, logger="herald.idempotency"):
        api.post("events", EVENT, key="logged-key-0001")
        api.post("events", {**EVENT, "data": {}}, key="logged-key-0001")
    records = [record for record in caplog.records if record.name == "herald.idempotency"]
    assert [record.getMessage() for record in records] == ["idempotency.replayed", "idempotency.mismatch"]
    # the handler configured in settings.LOGGING: its request-id filter and JSON formatter
    (console,) = [h for h in logging.getLogger().handlers if type(h.formatter).__name__ == "JsonFormatter"]
    for record in records:
        line = console.format(record)
        assert "\n" not in line
        fields = json.loads(line)
        assert fields["credential"] == api.credential.id
        assert fields["path"] == "/api/v1/events"
        assert fields["original_status"] == 202
        assert fields["age_seconds"] >= 0
        assert fields["request_id"].startswith("req_")
        assert "logged-key-0001" not in line  # the key is hashed
        assert len(fields["key_sha256"]) == 16


def test_stored_headers_never_include_hop_by_hop_or_secret_headers():
    response = HttpResponse(b"{}", status=201, content_type="application/json")
    for name in ("Set-Cookie", "Authorization", "Connection", "Date", "Content-Length", "Transfer-Encoding"):
        response[name] = "x"
    response["Location"] = "/api/v1/events/evt_1"
    stored = _stored_response(response)
    assert {name.lower() for name, _ in stored["headers"]} == {"content-type", "location"}
    assert stored["status"] == 201 and stored["body"] == b"{}"
