"""The portal's "Resend all failed since …" with its progress page, and the lists' time range (SPEC §9, §11)."""
from datetime import datetime, timedelta, timezone

import pytest
from django.db import transaction
from django.test import Client

from tests.conftest import create_endpoint
from tests.test_portal import _portal
from webhooks.models import Delivery, Recovery, Tenant
from webhooks.services.events import event_ingest
from webhooks.services.recovery import recovery_step

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def failed(api):
    """An endpoint with four failed deliveries, of events one an hour from T0."""
    endpoint = create_endpoint(api, "https://a.example.com/hook")
    tenant = Tenant.objects.get(pk=api.tenant.pk)
    events = []
    for hour in range(4):
        with transaction.atomic():
            events.append(event_ingest(tenant=tenant, event_type="invoice.paid", data={}, channels=[],
                                       now=T0 + timedelta(hours=hour)).id)
    Delivery.objects.update(status=Delivery.FAILED, next_attempt_at=None, updated_at=T0)
    return {"endpoint": endpoint["id"], "events": events}


def test_resend_all_failed_since_shows_its_progress_until_completed(api, failed):
    client = _portal(api)
    page = client.get(f"/portal/endpoints/{failed['endpoint']}").content
    assert b'id="recover"' in page and b'id="last-recovery"' not in page

    response = client.post(f"/portal/endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T13:00"})
    assert response.status_code == 302
    recovery = Recovery.objects.get()
    assert response["Location"] == f"/portal/recoveries/{recovery.pk}"
    assert (recovery.total, recovery.since, recovery.until) == (3, T0 + timedelta(hours=1), None)
    progress = client.get(response["Location"])
    assert progress.status_code == 200
    assert b'<meta http-equiv="refresh"' in progress.content and b"0 of 3 sent again" in progress.content

    assert recovery_step(recovery_id=recovery.pk, step=0) == "running"  # what a worker does
    Delivery.objects.filter(status=Delivery.PENDING).update(status=Delivery.SUCCEEDED, next_attempt_at=None)
    assert recovery_step(recovery_id=recovery.pk, step=1) == "completed"
    done = client.get(response["Location"]).content
    assert b"3 of 3 sent again" in done and b"completed" in done and b'http-equiv="refresh"' not in done
    assert f"{recovery.pk}".encode() in client.get(f"/portal/endpoints/{failed['endpoint']}").content
    assert Delivery.objects.get(event_id=failed["events"][0]).status == Delivery.FAILED


@pytest.mark.parametrize("form", [{}, {"since": "not a time"}, {"since": "2026-03-01T13:00", "until": "2026-03-01T12:00"}])
def test_a_bad_since_is_shown_on_the_page_and_changes_nothing(api, failed, form):
    client = _portal(api)
    response = client.post(f"/portal/endpoints/{failed['endpoint']}/recover", form)
    assert response.status_code == 400 and b'class="error"' in response.content
    assert Recovery.objects.count() == 0


def test_a_disabled_endpoint_is_refused_on_the_page(api, failed):
    api.patch(f"endpoints/{failed['endpoint']}", {"enabled": False})
    response = _portal(api).post(f"/portal/endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T13:00"})
    assert response.status_code == 409 and b"enable it first" in response.content
    assert Recovery.objects.count() == 0


def test_a_second_resend_while_one_runs_is_refused_on_the_page(api, failed):
    client = _portal(api)
    first = client.post(f"/portal/endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T13:00"})
    assert first.status_code == 302
    again = client.post(f"/portal/endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T12:00"})
    assert again.status_code == 409 and b"A recovery of this endpoint is running" in again.content
    assert Recovery.objects.count() == 1


def test_another_tenants_endpoint_and_recovery_are_not_found(api, other_api, failed):
    client = _portal(other_api)
    assert client.post(f"/portal/endpoints/{failed['endpoint']}/recover",
                       {"since": "2026-03-01T13:00"}).status_code == 404
    recovery = api.post(f"endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T12:00:00Z"}).json()
    assert client.get(f"/portal/recoveries/{recovery['id']}").status_code == 404
    assert Recovery.objects.count() == 1 and Delivery.objects.filter(status=Delivery.PENDING).count() == 0


def test_the_recover_form_needs_its_csrf_token(api, failed):
    client = _portal(api, enforce_csrf_checks=True)
    assert client.post(f"/portal/endpoints/{failed['endpoint']}/recover",
                       {"since": "2026-03-01T13:00"}).status_code == 403
    assert Recovery.objects.count() == 0


def test_events_and_deliveries_lists_take_a_time_range(api, failed):
    client = _portal(api)
    events = failed["events"]
    page = client.get("/portal/events", {"created_after": "2026-03-01T13:00", "created_before": "2026-03-01T15:00"})
    assert page.status_code == 200
    assert [e in page.content.decode() for e in events] == [False, True, True, False]
    page = client.get("/portal/deliveries", {"created_after": "2026-03-01T14:00", "status": "failed"})
    shown = {d.event_id for d in page.context["deliveries"]}
    assert shown == set(events[2:])
    bad = client.get("/portal/deliveries", {"created_after": "2026-03-01T14:00", "created_before": "2026-03-01T13:00"})
    assert bad.status_code == 400 and b'class="error"' in bad.content
    assert client.get("/portal/events", {"created_before": "soon"}).status_code == 400


def test_a_session_is_needed(failed):
    assert Client().post(f"/portal/endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T13:00"}).status_code == 403


def test_the_admin_filters_events_and_deliveries_by_time_and_shows_recoveries(admin_client, api, failed):
    """The admin's created_at list filter (its links and any ?created_at__gte=…&created_at__lt= range), and
    the read-only recoveries pages."""
    events = failed["events"]

    def listed(url, **params):
        response = admin_client.get(url, params)
        assert response.status_code == 200
        return sorted(str(obj.pk) for obj in response.context["cl"].result_list)

    page = admin_client.get("/admin/webhooks/event/")
    assert b"created_at__gte" in page.content  # the filter's links
    assert listed("/admin/webhooks/event/", created_at__gte="2026-03-01 13:00:00+00:00",
                  created_at__lt="2026-03-01 15:00:00+00:00") == events[1:3]
    shown = listed("/admin/webhooks/delivery/", created_at__gte="2026-03-01 14:00:00+00:00", status__exact="failed")
    assert shown == sorted(Delivery.objects.filter(event_id__in=events[2:]).values_list("pk", flat=True))
    recovery = api.post(f"endpoints/{failed['endpoint']}/recover", {"since": "2026-03-01T12:00:00Z"}).json()
    assert listed("/admin/webhooks/recovery/") == [recovery["id"]]
    change = admin_client.get(f"/admin/webhooks/recovery/{recovery['id']}/change/")
    assert change.status_code == 200 and b"running" in change.content
    assert admin_client.post(f"/admin/webhooks/recovery/{recovery['id']}/delete/").status_code == 403
