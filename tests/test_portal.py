"""The tenant portal through Django's test client against real PostgreSQL: links, sessions, isolation, CSRF,
and that its writes go through the API's services (the browser test drives it end to end)."""
import time
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from tests.conftest import create_endpoint, make_api
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, Event, PortalLink

pytestmark = pytest.mark.django_db(transaction=True)


def _link(api) -> str:
    response = api.post("portal-links")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"url", "expires_at"}
    return urlsplit(body["url"]).path


def _open(client: Client, path: str, **options):
    """What a person does with a link: open it (a page with a button), then press Continue."""
    shown = client.get(path, **options)
    if shown.status_code != 200:
        return shown
    assert b'id="continue"' in shown.content
    return client.post(path, {"csrfmiddlewaretoken": str(shown.context["csrf_token"])}, **options)


def _portal(api, **client_options) -> Client:
    client = Client(**client_options)
    response = _open(client, _link(api))
    assert response.status_code == 302 and response["Location"] == "/portal/"
    return client


def test_a_link_opens_once_with_a_strict_cookie_and_only_within_its_time(api, settings):
    path = _link(api)
    token = path.rsplit("/", 1)[1]
    link = PortalLink.objects.get()
    assert token not in link.token_hash and len(link.token_hash) == 64  # only its hash is kept
    assert 590 <= (link.expires_at - timezone.now()).total_seconds() <= 600

    # fetching it (a mail scanner, a chat preview) does not use it up
    for _ in range(3):
        assert Client().get(path).status_code == 200
    client = Client()
    opened = _open(client, path)
    assert opened.status_code == 302
    cookie = opened.cookies[settings.SESSION_COOKIE_NAME]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and not cookie["secure"]  # plain http locally
    assert client.get("/portal/").status_code == 200

    again = Client().get(path)
    assert again.status_code == 410 and b"cannot be used" in again.content
    assert Client().post(path).status_code == 410
    # a link past its time is refused too; behind https the cookie is Secure
    expired = _link(api)
    PortalLink.objects.filter(expires_at__gt=timezone.now() + timedelta(seconds=60)).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get(expired).status_code == 410
    secure = _open(Client(), _link(api), secure=True)
    assert secure.status_code == 302 and secure.cookies[settings.SESSION_COOKIE_NAME]["secure"]


def test_the_session_ends_on_logout_and_after_its_hours(api, settings):
    client = _portal(api)
    assert client.post("/portal/logout").status_code == 200
    assert client.get("/portal/").status_code == 403
    client = _portal(api)
    session = client.session
    session["portal_since"] = time.time() - settings.PORTAL_SESSION_SECONDS - 1
    session.save()
    refused = client.get("/portal/")
    assert refused.status_code == 403 and b"session has ended" in refused.content
    assert Client().get("/portal/deliveries").status_code == 403  # no session at all


def test_another_tenants_objects_are_not_found_and_nothing_of_theirs_changes(api, other_api):
    theirs = create_endpoint(other_api, "https://theirs.example.com/hook")
    event = other_api.send_event("invoice.paid")
    delivery_id = event["deliveries"][0]["id"]
    Delivery.objects.filter(pk=delivery_id).update(status=Delivery.FAILED)
    client = _portal(api)
    for url in (f"/portal/endpoints/{theirs['id']}", f"/portal/deliveries/{delivery_id}", f"/portal/events/{event['id']}"):
        assert client.get(url).status_code == 404, url
    for url in (f"/portal/endpoints/{theirs['id']}/secret", f"/portal/endpoints/{theirs['id']}/rotate",
                f"/portal/endpoints/{theirs['id']}/test", f"/portal/deliveries/{delivery_id}/resend"):
        assert client.post(url).status_code == 404, url
    assert client.post(f"/portal/endpoints/{theirs['id']}", {"url": "https://evil.example.com/"}).status_code == 404
    assert Endpoint.objects.get(pk=theirs["id"]).url == "https://theirs.example.com/hook"
    assert Delivery.objects.get(pk=delivery_id).status == Delivery.FAILED
    assert Event.objects.filter(type="herald.test").count() == 0
    assert theirs["id"].encode() not in client.get("/portal/").content


def test_every_form_needs_its_csrf_token(api):
    endpoint = create_endpoint(api, "https://a.example.com/hook")
    client = Client(enforce_csrf_checks=True)
    link = _link(api)
    assert client.post(link).status_code == 403  # even the link's own button
    assert _open(client, link).status_code == 302
    assert client.post(f"/portal/endpoints/{endpoint['id']}/rotate").status_code == 403
    assert client.post("/portal/endpoints/new", {"url": "https://b.example.com/"}).status_code == 403
    assert Endpoint.objects.count() == 1
    page = client.get(f"/portal/endpoints/{endpoint['id']}")
    token = page.context["csrf_token"]
    assert client.post(f"/portal/endpoints/{endpoint['id']}/rotate", {"csrfmiddlewaretoken": str(token)}).status_code == 302


def test_endpoints_are_created_and_edited_with_the_apis_rules(api, settings):
    client = _portal(api)
    refused = client.post("/portal/endpoints/new", {"url": "ftp://nope", "event_types": "invoice.*"})
    assert refused.status_code == 400 and Endpoint.objects.count() == 0
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    private = client.post("/portal/endpoints/new", {"url": "http://127.0.0.1:9/hook"})
    assert private.status_code == 400 and b"127.0.0.1" in private.content
    assert Endpoint.objects.count() == 0
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True  # the tests' receivers; example.com is not looked up then
    created = client.post("/portal/endpoints/new", {"url": "https://a.example.com/hook", "event_types": "invoice.*, customer.created",
                                                    "channels": "eu", "max_in_flight": "3", "throttle_rate": "",
                                                    "ordering": "fifo", "description": "billing"})
    assert created.status_code == 302
    endpoint = Endpoint.objects.get()
    assert (endpoint.event_types, endpoint.channels, endpoint.max_in_flight, endpoint.throttle_rate, endpoint.ordering) == (
        ["invoice.*", "customer.created"], ["eu"], 3, None, "fifo")
    bad = client.post(f"/portal/endpoints/{endpoint.pk}", {"form": "edit", "url": endpoint.url, "max_in_flight": "0",
                                                          "enabled": "on"})
    assert bad.status_code == 400 and Endpoint.objects.get().max_in_flight == 3
    saved = client.post(f"/portal/endpoints/{endpoint.pk}", {"form": "edit", "url": endpoint.url, "event_types": "",
                                                            "channels": "", "max_in_flight": "", "throttle_rate": "5",
                                                            "ordering": "unordered", "description": "x"})
    assert saved.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.throttle_rate, endpoint.event_types, endpoint.max_in_flight) == (False, 5, [], None)


def test_the_secret_shows_only_on_an_explicit_click(api):
    endpoint = create_endpoint(api, "https://a.example.com/hook")
    client = _portal(api)
    assert b"whsec_" not in client.get(f"/portal/endpoints/{endpoint['id']}").content
    assert b"whsec_" not in client.get("/portal/").content
    shown = client.post(f"/portal/endpoints/{endpoint['id']}/secret")
    assert shown.status_code == 200 and shown["Cache-Control"] == "no-store"
    assert endpoint["secret"].encode() in shown.content
    client.post(f"/portal/endpoints/{endpoint['id']}/rotate")
    rotated = client.post(f"/portal/endpoints/{endpoint['id']}/secret").content
    assert endpoint["secret"].encode() not in rotated and b"whsec_" in rotated


def test_a_test_event_goes_to_that_endpoint_only_through_the_api_and_the_portal(api):
    target = create_endpoint(api, "https://a.example.com/hook")
    create_endpoint(api, "https://b.example.com/hook", event_types=["herald.*"])  # would get operational events
    response = api.post(f"endpoints/{target['id']}/test")
    assert response.status_code == 202 and response["Location"].startswith("/api/v1/events/")
    body = response.json()
    assert body["type"] == "herald.test" and [d["endpoint_id"] for d in body["deliveries"]] == [target["id"]]
    client = _portal(api)
    sent = client.post(f"/portal/endpoints/{target['id']}/test")
    assert sent.status_code == 302 and sent["Location"].startswith("/portal/events/evt_")
    event = Event.objects.filter(type="herald.test").order_by("-id").first()
    assert list(event.deliveries.values_list("endpoint_id", flat=True)) == [target["id"]]
    assert b"herald.test" in client.get(sent["Location"]).content


def test_deliveries_filter_and_resend_with_attempts_shown(api):
    a = create_endpoint(api, "https://a.example.com/hook", event_types=["invoice.*"])
    create_endpoint(api, "https://b.example.com/hook", event_types=["customer.*"])
    paid = api.delivery_id("invoice.paid")
    created = api.delivery_id("customer.created")
    delivery = Delivery.objects.get(pk=paid)
    DeliveryAttempt.objects.create(delivery=delivery, number=1, started_at=timezone.now(), duration_ms=12,
                                   response_status=500, response_body="boom on the first try")
    Delivery.objects.filter(pk=paid).update(status=Delivery.FAILED, attempt_count=1, next_attempt_at=None)
    client = _portal(api)
    listed = client.get("/portal/deliveries", {"status": "failed"}).content
    assert paid.encode() in listed and created.encode() not in listed
    assert created.encode() in client.get("/portal/deliveries", {"type": "customer.created"}).content
    assert paid.encode() not in client.get("/portal/deliveries", {"endpoint": a["id"], "status": "pending"}).content
    page = client.get(f"/portal/deliveries/{paid}").content
    assert b"boom on the first try" in page and b"500" in page and b'id="resend"' in page
    assert client.post(f"/portal/deliveries/{paid}/resend").status_code == 302
    assert Delivery.objects.get(pk=paid).status == Delivery.PENDING


def test_the_chart_counts_the_last_days_deliveries_by_outcome(api):
    endpoint = create_endpoint(api, "https://a.example.com/hook")
    ids = [api.delivery_id("a.b") for _ in range(3)]
    Delivery.objects.filter(pk=ids[0]).update(status=Delivery.SUCCEEDED)
    Delivery.objects.filter(pk=ids[1]).update(status=Delivery.FAILED)
    page = _portal(api).get("/portal/").content.decode()
    assert ": 1 succeeded</title>" in page and ": 1 failed</title>" in page and ": 1 pending</title>" in page
    assert endpoint["url"] in page


def test_a_portal_link_is_for_an_authenticated_credential_only(api):
    assert Client().post("/api/v1/portal-links", HTTP_IDEMPOTENCY_KEY="portal-link-0001").status_code == 401
    assert make_api("globex").post("portal-links").status_code == 201


def test_events_are_listed_by_type_with_their_deliveries_and_only_the_tenants(api, other_api):
    create_endpoint(api, "https://a.example.com/hook")
    create_endpoint(other_api, "https://b.example.com/hook")
    paid = api.send_event("invoice.paid")
    created = api.send_event("customer.created")
    theirs = other_api.send_event("invoice.paid")
    client = _portal(api)
    listed = client.get("/portal/events").content.decode()
    assert paid["id"] in listed and created["id"] in listed and theirs["id"] not in listed
    assert paid["deliveries"][0]["id"] in listed  # each event links its deliveries, with their status
    filtered = client.get("/portal/events", {"type": "customer.created"}).content.decode()
    assert created["id"] in filtered and paid["id"] not in filtered


def test_a_broker_endpoint_is_created_shown_and_edited_without_its_credentials(api):
    from webhooks.models import EndpointAccess

    client = _portal(api)
    url = "amqp://shop:p4ss-word@127.0.0.1:5672/orders"
    foreign = client.post("/portal/endpoints/new", {"kind": "amqp", "url": url, "exchange": "x", "routing_key": "k",
                                                    "subject": "nats.only"})
    assert foreign.status_code == 400 and b"Not a field of a amqp endpoint" in foreign.content
    missing = client.post("/portal/endpoints/new", {"kind": "amqp", "url": url, "exchange": "x"})
    assert missing.status_code == 400 and Endpoint.objects.count() == 0
    created = client.post("/portal/endpoints/new", {"kind": "amqp", "url": url, "exchange": "orders",
                                                    "routing_key": "paid", "event_types": "invoice.*"})
    assert created.status_code == 302, created.content.decode()[-2000:]
    endpoint = Endpoint.objects.get()
    assert endpoint.kind == "amqp" and endpoint.url == "amqp://127.0.0.1:5672/orders"
    page = client.get(f"/portal/endpoints/{endpoint.pk}").content.decode()
    assert "p4ss-word" not in page and "shop:" not in page
    assert 'value="paid"' in page and 'id="headers-form"' not in page  # no HTTP access on a broker
    # saved with the URL as shown: its credentials stay; the routing key changes
    saved = client.post(f"/portal/endpoints/{endpoint.pk}", {"form": "edit", "url": endpoint.url, "exchange": "orders",
                                                            "routing_key": "paid.eu", "enabled": "on"})
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    row = EndpointAccess.objects.get(endpoint=endpoint)
    assert row.destination["routing_key"] == "paid.eu"
    from webhooks import crypto

    assert crypto.decrypt(row.encrypted_url) == url
    bad = client.post(f"/portal/endpoints/{endpoint.pk}", {"form": "edit", "url": endpoint.url, "routing_key": "a" * 300,
                                                          "enabled": "on"})
    assert bad.status_code == 400
    assert EndpointAccess.objects.get(endpoint=endpoint).destination["routing_key"] == "paid.eu"
