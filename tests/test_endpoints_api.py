"""Endpoint CRUD, secrets and rotation, URL checks and tenant isolation through the REST API."""
import base64

import pytest
from standardwebhooks import Webhook

from tests.conftest import create_endpoint
from webhooks.models import Delivery, Endpoint, EndpointSecret, Event
from webhooks.services.endpoints import endpoint_disable

pytestmark = pytest.mark.django_db(transaction=True)


def _create(api, **body):
    body.setdefault("url", "https://hooks.example.com/herald")
    return create_endpoint(api, **body)


def test_create_answers_the_endpoint_and_its_secret_comes_only_from_the_secret_call(api):
    response = api.post("endpoints", {"url": "https://hooks.example.com/x", "event_types": ["invoice.*"],
                                      "channels": ["eu"], "description": "billing"})
    assert response.status_code == 201
    endpoint = response.json()
    assert endpoint["id"].startswith("ep_")
    assert response["Location"] == f"/api/v1/endpoints/{endpoint['id']}"
    assert endpoint["event_types"] == ["invoice.*"] and endpoint["channels"] == ["eu"]
    assert endpoint["enabled"] is True
    assert "secret" not in endpoint and b"whsec_" not in response.content
    answer = api.get(f"endpoints/{endpoint['id']}/secret")
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    secret = answer.json()["secret"]
    assert secret.startswith("whsec_")
    assert 24 <= len(base64.b64decode(secret.removeprefix("whsec_"))) <= 64
    Webhook(secret)  # the reference library accepts it
    # at rest it is encrypted: the column holds a Fernet token that SECRET_KEY's key opens
    stored = EndpointSecret.objects.get(endpoint_id=endpoint["id"])
    assert "whsec_" not in stored.encrypted_secret and secret.removeprefix("whsec_") not in stored.encrypted_secret
    assert stored.secret == secret


def test_no_body_but_the_secret_calls_carries_a_secret(api):
    endpoint = _create(api)
    bodies = [api.get("endpoints").content, api.get(f"endpoints/{endpoint['id']}").content,
              api.patch(f"endpoints/{endpoint['id']}", {"description": "x"}).content,
              api.post(f"endpoints/{endpoint['id']}/rotate-secret").content]
    assert not [body for body in bodies if b"whsec_" in body]
    # nor does any stored idempotency response
    from intake.models import IdempotencyKey

    assert IdempotencyKey.objects.count() >= 3
    assert not [key.pk for key in IdempotencyKey.objects.all() if b"whsec_" in bytes(key.response_body or b"")]


def test_another_tenants_secret_is_not_found(api, other_api):
    endpoint = _create(api)
    assert other_api.get(f"endpoints/{endpoint['id']}/secret").status_code == 404


def test_list_get_patch_and_delete(api):
    a = _create(api, url="https://a.example.com/")
    b = _create(api, url="https://b.example.com/")
    listed = api.get("endpoints").json()
    assert [e["id"] for e in listed["data"]] == [b["id"], a["id"]]  # newest first
    assert listed["next_cursor"] is None
    assert api.get(f"endpoints/{a['id']}").json() == {key: value for key, value in a.items() if key != "secret"}

    patched = api.patch(f"endpoints/{a['id']}", {"enabled": False, "event_types": ["customer.created"]})
    assert patched.status_code == 200
    assert patched.json()["enabled"] is False and patched.json()["event_types"] == ["customer.created"]

    assert api.delete(f"endpoints/{a['id']}").status_code == 204
    assert api.get(f"endpoints/{a['id']}").status_code == 404
    assert [e["id"] for e in api.get("endpoints").json()["data"]] == [b["id"]]


def test_list_is_cursor_paginated(api):
    ids = [_create(api, url=f"https://{n}.example.com/")["id"] for n in range(5)]
    page1 = api.get("endpoints", limit=2).json()
    page2 = api.get("endpoints", limit=2, cursor=page1["next_cursor"]).json()
    page3 = api.get("endpoints", limit=2, cursor=page2["next_cursor"]).json()
    seen = [e["id"] for page in (page1, page2, page3) for e in page["data"]]
    assert seen == list(reversed(ids))
    assert page3["next_cursor"] is None
    assert api.get("endpoints", limit=101).status_code == 400


def test_delete_cancels_pending_deliveries(api):
    endpoint = _create(api)
    delivery_id = api.delivery_id("invoice.paid")
    assert api.delete(f"endpoints/{endpoint['id']}").status_code == 204
    assert Delivery.objects.get(pk=delivery_id).status == Delivery.CANCELLED


def test_rotate_secret_keeps_the_old_one_signing_for_a_day(api):
    endpoint = _create(api)
    rotated = api.post(f"endpoints/{endpoint['id']}/rotate-secret")
    assert rotated.status_code == 200
    new_secret = api.get(f"endpoints/{endpoint['id']}/secret").json()["secret"]
    assert new_secret.startswith("whsec_") and new_secret != endpoint["secret"]
    old, new = sorted(EndpointSecret.objects.filter(endpoint_id=endpoint["id"]), key=lambda s: s.created_at)
    assert (old.secret, new.secret) == (endpoint["secret"], new_secret)
    assert new.expires_at is None
    assert 23.9 * 3600 < (old.expires_at - new.created_at).total_seconds() <= 24 * 3600


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/hook", "http://localhost/hook", "http://10.0.0.7/",
                                 "http://169.254.169.254/latest/meta-data", "http://100.64.0.1/", "http://[::1]/"])
def test_private_network_urls_are_refused_unless_allowed(api, settings, url):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    response = api.post("endpoints", {"url": url})
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert "url" in response.json()["errors"]
    assert not Endpoint.objects.exists()
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    assert api.post("endpoints", {"url": url}).status_code == 201


@pytest.mark.parametrize("body", [{"url": "ftp://example.com/"}, {"url": "not a url"}, {},
                                  {"url": "https://example.com/", "event_types": ["bad type"]},
                                  {"url": "https://example.com/", "event_types": "invoice.paid"},
                                  {"url": "https://example.com/", "channels": ["no spaces please"]}])
def test_invalid_endpoints_are_400_and_store_nothing(api, body):
    response = api.post("endpoints", body)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "validation_error"
    assert not Endpoint.objects.exists()


def test_another_tenants_endpoint_is_404_for_every_verb(api, other_api):
    theirs = _create(other_api)
    for response in (api.get(f"endpoints/{theirs['id']}"),
                     api.patch(f"endpoints/{theirs['id']}", {"enabled": False}),
                     api.delete(f"endpoints/{theirs['id']}"),
                     api.post(f"endpoints/{theirs['id']}/rotate-secret")):
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    assert api.get("endpoints").json()["data"] == []
    assert Endpoint.objects.get(pk=theirs["id"]).enabled is True


def test_max_in_flight_and_health_are_part_of_every_endpoint(api, settings):
    settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT = 7
    default = _create(api)
    assert default["max_in_flight"] == 7
    assert default["health"] == {"state": "healthy", "consecutive_failures": 0, "failing_since": None,
                                 "next_probe_at": None}
    own = _create(api, url="https://b.example.com/", max_in_flight=250)
    assert own["max_in_flight"] == 250
    assert api.patch(f"endpoints/{own['id']}", {"max_in_flight": 1}).json()["max_in_flight"] == 1
    assert api.patch(f"endpoints/{own['id']}", {"max_in_flight": None}).json()["max_in_flight"] == 7
    disabled = api.patch(f"endpoints/{own['id']}", {"enabled": False}).json()
    assert disabled["health"]["state"] == "disabled"


@pytest.mark.parametrize("value", [0, 1001, -1, "ten", 2.5])
def test_max_in_flight_out_of_range_is_400_and_changes_nothing(api, value):
    endpoint = _create(api)
    response = api.post("endpoints", {"url": "https://c.example.com/", "max_in_flight": value})
    assert response.status_code == 400 and "max_in_flight" in response.json()["errors"]
    response = api.patch(f"endpoints/{endpoint['id']}", {"max_in_flight": value})
    assert response.status_code == 400
    assert Endpoint.objects.get(pk=endpoint["id"]).max_in_flight is None
    assert Endpoint.objects.count() == 1


def test_a_tripped_endpoint_shows_when_it_will_be_probed(api):
    from django.utils import timezone

    endpoint = _create(api)
    now = timezone.now()
    Endpoint.objects.filter(pk=endpoint["id"]).update(consecutive_failures=5, tripped_at=now, failing_since=now,
                                                      next_probe_at=now)
    health = api.get(f"endpoints/{endpoint['id']}").json()["health"]
    assert health["state"] == "tripped" and health["consecutive_failures"] == 5
    assert health["next_probe_at"] == health["failing_since"] == now.isoformat().replace("+00:00", "Z")


def test_ordering_and_throttle_rate_are_endpoint_options(api):
    plain = _create(api)
    assert (plain["ordering"], plain["throttle_rate"]) == ("unordered", None)
    shaped = _create(api, url="https://b.example.com/", ordering="fifo", throttle_rate=20)
    assert (shaped["ordering"], shaped["throttle_rate"]) == ("fifo", 20)
    patched = api.patch(f"endpoints/{shaped['id']}", {"ordering": "unordered", "throttle_rate": None}).json()
    assert (patched["ordering"], patched["throttle_rate"]) == ("unordered", None)


@pytest.mark.parametrize("body", [{"ordering": "lifo"}, {"ordering": None}, {"throttle_rate": 0},
                                  {"throttle_rate": 10001}, {"throttle_rate": "fast"}])
def test_bad_ordering_or_throttle_is_400_and_changes_nothing(api, body):
    endpoint = _create(api)
    response = api.post("endpoints", {"url": "https://c.example.com/", **body})
    assert response.status_code == 400 and set(body) <= set(response.json()["errors"])
    assert api.patch(f"endpoints/{endpoint['id']}", body).status_code == 400
    unchanged = Endpoint.objects.get(pk=endpoint["id"])
    assert (unchanged.ordering, unchanged.throttle_rate) == ("unordered", None)
    assert Endpoint.objects.count() == 1


@pytest.mark.parametrize("allow_private", [True, False])
@pytest.mark.parametrize("url", ["https://user:secret@hooks.example.com/in", "https://token@hooks.example.com/in",
                                 "https://user:secret@93.184.216.34:8443/in", "http://u:p@127.0.0.1:9/"])
def test_urls_with_a_user_name_or_password_are_refused(api, settings, allow_private, url):
    """They were copied into Herald's own events (herald.endpoint.disabled …) sent to the tenant's other
    receivers."""
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = allow_private
    created = api.post("endpoints", {"url": url})
    assert created.status_code == 400, created.content
    assert created.json()["code"] == "validation_error"
    assert created.json()["errors"]["url"] == ["The URL must not contain a user name or password."]
    assert b"secret" not in created.content and not Endpoint.objects.exists()
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    endpoint = _create(api)
    patched = api.patch(f"endpoints/{endpoint['id']}", {"url": url})
    assert patched.status_code == 400 and patched.json()["errors"]["url"]
    assert Endpoint.objects.get(pk=endpoint["id"]).url == endpoint["url"]


def test_an_endpoint_made_with_credentials_before_keeps_them_out_of_heralds_events(api):
    """Endpoints stored before the refusal keep their URL (libcurl still sends its credentials as Basic auth:
    stripping them would break the receiver), but Herald's own events name it without them."""
    watcher = _create(api)
    api.patch(f"endpoints/{watcher['id']}", {"event_types": ["herald.*"]})
    old = Endpoint.objects.create(tenant=api.tenant, url="https://user:s3cret@hooks.example.com/in")
    assert endpoint_disable(endpoint_id=old.pk, reason="gone")
    (event,) = Event.objects.filter(type="herald.endpoint.disabled")
    assert event.data["url"] == "https://hooks.example.com/in" and b"s3cret" not in bytes(event.payload)
    assert Endpoint.objects.get(pk=old.pk).url == "https://user:s3cret@hooks.example.com/in"
