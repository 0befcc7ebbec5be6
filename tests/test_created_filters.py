"""`?created_after=` / `?created_before=` on the event and delivery lists (SPEC §4): [after, before)."""
from datetime import datetime, timedelta, timezone

import pytest
from django.db import transaction

from webhooks.models import Tenant
from webhooks.services.events import event_ingest

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def timeline(api):
    """An endpoint and four events, one an hour from T0 (the last at T0 + 3 h)."""
    api.post("endpoints", {"url": "https://a.example.com/"})
    tenant = Tenant.objects.get(pk=api.tenant.pk)
    events = []
    for hour in range(4):
        with transaction.atomic():
            events.append(event_ingest(tenant=tenant, event_type="invoice.paid", data={"n": hour}, channels=[],
                                       now=T0 + timedelta(hours=hour)).id)
    return events


def _ids(response):
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["data"]]


def test_events_between_after_inclusive_and_before_exclusive(api, timeline):
    got = _ids(api.get("events", created_after="2026-03-01T13:00:00Z", created_before="2026-03-01T15:00:00Z"))
    assert got == [timeline[2], timeline[1]]
    assert _ids(api.get("events", created_after="2026-03-01T14:00:00Z")) == [timeline[3], timeline[2]]
    assert _ids(api.get("events", created_before="2026-03-01T13:00:00Z")) == [timeline[0]]
    # another offset names the same instant; no offset is UTC
    assert _ids(api.get("events", created_after="2026-03-01T15:00:00+01:00")) == [timeline[3], timeline[2]]
    assert _ids(api.get("events", created_before="2026-03-01T13:00:00")) == [timeline[0]]
    # with the type filter and the cursor
    first = api.get("events", created_after="2026-03-01T12:00:00Z", type="invoice.paid", limit=2).json()
    assert [e["id"] for e in first["data"]] == [timeline[3], timeline[2]]
    rest = _ids(api.get("events", created_after="2026-03-01T12:30:00Z", cursor=first["next_cursor"]))
    assert rest == [timeline[1]]


def test_deliveries_by_time_with_the_other_filters(api, timeline):
    got = api.get("deliveries", created_after="2026-03-01T13:00:00Z", created_before="2026-03-01T14:00:00Z").json()
    assert [d["event_id"] for d in got["data"]] == [timeline[1]]
    got = api.get("deliveries", created_after="2026-03-01T14:00:00Z", status="pending").json()
    assert [d["event_id"] for d in got["data"]] == [timeline[3], timeline[2]]
    assert _ids(api.get("deliveries", created_after="2026-03-01T14:00:00Z", status="failed")) == []


@pytest.mark.parametrize("params", [
    {"created_after": "yesterday"},
    {"created_before": "2026-13-01T00:00:00Z"},
    {"created_after": "9999-12-31T23:59:59-05:00"},  # past datetime's range in UTC
    {"created_after": "2026-03-01T14:00:00Z", "created_before": "2026-03-01T13:00:00Z"},
    {"created_after": "2026-03-01T14:00:00Z", "created_before": "2026-03-01T14:00:00Z"},
    {"created_after": "x" * 5000},
])
@pytest.mark.parametrize("path", ["events", "deliveries"])
def test_a_bad_time_is_a_validation_problem(api, timeline, path, params):
    response = api.get(path, **params)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "validation_error" and set(problem["errors"]) <= {"created_after", "created_before"}


def test_another_tenants_events_stay_out_of_the_range(api, other_api, timeline):
    assert _ids(other_api.get("events", created_after="2026-01-01T00:00:00Z")) == []
    assert _ids(other_api.get("deliveries", created_after="2026-01-01T00:00:00Z")) == []
