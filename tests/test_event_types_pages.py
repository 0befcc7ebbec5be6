"""The event-type catalog in the tenant portal (read it; pick an endpoint's types from it) and in the admin
(edit it, with the API's checks)."""
import html

import pytest
from django.urls import reverse

from tests.test_event_types_api import INVOICE_SCHEMA
from tests.test_portal import _portal
from webhooks.models import Endpoint, EventType
from webhooks.services.event_catalog import event_type_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def catalog(db):
    event_type_create(name="invoice.paid", description="An invoice was paid in full.", schema=INVOICE_SCHEMA,
                      example={"invoice": "in_1", "amount": 1200})
    event_type_create(name="customer.created", description="A customer signed up.")


def test_the_portal_shows_the_catalog_with_descriptions_schemas_and_examples(api, catalog):
    client = _portal(api)
    assert b'href="/portal/event-types"' in client.get("/portal/").content
    page = client.get("/portal/event-types")
    assert page.status_code == 200
    text = html.unescape(page.content.decode())
    for shown in ("invoice.paid", "An invoice was paid in full.", "customer.created", "A customer signed up.",
                  '"pattern": "^in_"', '"required": [', '"amount": 1200'):
        assert shown in text, shown
    assert text.count('class="schema"') == 1 and text.count('class="example"') == 1  # customer.created has neither


def test_the_portal_catalog_page_needs_a_session(catalog):
    from django.test import Client

    assert Client().get("/portal/event-types").status_code == 403


def test_an_endpoint_picks_its_types_from_the_catalog_and_keeps_its_patterns(api, catalog, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    client = _portal(api)
    form = client.get("/portal/endpoints/new").content.decode()
    assert 'name="catalog_type" value="invoice.paid"' in form
    assert 'name="catalog_type" value="customer.created"' in form

    created = client.post("/portal/endpoints/new", {"url": "https://a.example.com/hook",
                                                    "catalog_type": ["invoice.paid"], "event_types": "order.*"})
    assert created.status_code == 302, created.content[-2000:]
    endpoint = Endpoint.objects.get()
    assert endpoint.event_types == ["invoice.paid", "order.*"]

    page = client.get(f"/portal/endpoints/{endpoint.pk}").content.decode()
    assert 'value="invoice.paid" checked' in page
    assert 'value="customer.created">' in page  # offered, not ticked
    assert 'name="event_types" value="order.*"' in page  # the text field holds what the catalog does not

    saved = client.post(f"/portal/endpoints/{endpoint.pk}", {
        "form": "edit", "url": endpoint.url, "catalog_type": ["customer.created"], "event_types": "",
        "channels": "", "max_in_flight": "", "throttle_rate": "", "ordering": "unordered", "enabled": "on"})
    assert saved.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.event_types == ["customer.created"]  # unticking invoice.paid removed it

    refused = client.post(f"/portal/endpoints/{endpoint.pk}", {
        "form": "edit", "url": endpoint.url, "catalog_type": ["not a type"], "event_types": "", "enabled": "on"})
    assert refused.status_code == 400
    endpoint.refresh_from_db()
    assert endpoint.event_types == ["customer.created"]


def _admin_url(view, *args):
    return reverse(f"admin:webhooks_eventtype_{view}", args=args)


def test_the_admin_adds_edits_and_deletes_catalog_entries_with_the_apis_checks(admin_client, catalog):
    assert admin_client.get(_admin_url("changelist")).status_code == 200

    refused = admin_client.post(_admin_url("add"), {"name": "order.placed", "description": "",
                                                    "schema": '{"type": "object", "required": ["id"]}',
                                                    "example": '{"total": 5}'})
    assert refused.status_code == 200
    assert "/example/id" in html.unescape(refused.content.decode())
    bad_schema = admin_client.post(_admin_url("add"), {"name": "order.placed", "schema": '{"type": "nope"}',
                                                       "example": ""})
    assert "/schema/type" in html.unescape(bad_schema.content.decode())
    reserved = admin_client.post(_admin_url("add"), {"name": "herald.test", "schema": "", "example": ""})
    assert "operational" in html.unescape(reserved.content.decode())
    assert not EventType.objects.filter(name__in=["order.placed", "herald.test"]).exists()

    added = admin_client.post(_admin_url("add"), {"name": "order.placed", "description": "An order.",
                                                  "schema": '{"type": "object", "required": ["id"]}',
                                                  "example": '{"id": "ord_1"}'})
    assert added.status_code == 302, added.content[-3000:]
    placed = EventType.objects.get(name="order.placed")
    assert placed.id.startswith("etype_") and placed.example == {"id": "ord_1"}
    assert placed.schema_digest is not None

    invoice = EventType.objects.get(name="invoice.paid")
    edited = admin_client.post(_admin_url("change", invoice.pk), {
        "description": "Paid.", "schema": "", "example": '{"anything": true}'})
    assert edited.status_code == 302, edited.content[-3000:]
    invoice.refresh_from_db()
    assert (invoice.description, invoice.schema, invoice.schema_digest, invoice.name) == (
        "Paid.", None, None, "invoice.paid")

    deleted = admin_client.post(_admin_url("delete", placed.pk), {"post": "yes"})
    assert deleted.status_code == 302
    assert not EventType.objects.filter(name="order.placed").exists()


def test_what_the_admin_changes_intake_checks_at_the_next_event(admin_client, api, catalog):
    invoice = EventType.objects.get(name="invoice.paid")
    body = {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 5}}
    assert api.post("events", body).status_code == 202
    admin_client.post(_admin_url("change", invoice.pk), {
        "description": "", "schema": '{"type": "object", "properties": {"amount": {"minimum": 10}}}', "example": ""})
    refused = api.post("events", body)
    assert refused.status_code == 400
    assert list(refused.json()["errors"]) == ["/data/amount"]
