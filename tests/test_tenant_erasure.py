"""Beat's erasure of a deleted tenant against real PostgreSQL: everything it owns goes, whatever its endpoints
were given (extra headers, auth, a recovery), and nothing of another tenant."""
from datetime import timedelta

import pytest
from django.utils import timezone

from intake.tenants import erasure_grace, tenant_delete, tenants_erase
from tests.conftest import create_endpoint
from tests.tenant_rows import owned_rows
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, Tenant
from webhooks.services.recovery import recovery_create

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tenant_whose_endpoints_have_headers_auth_and_a_recovery_is_erased_and_the_other_kept(api, other_api):
    # given: a tenant with an endpoint sending extra headers and basic auth, another plain one, a recovery,
    # events with deliveries and attempts; and another tenant with the same
    tenant = api.credential.tenant
    for client in (api, other_api):
        create_endpoint(client, "https://a.example.com/", headers={"X-Team": "billing"},
                        auth={"type": "basic", "username": "u", "password": "p"})
        create_endpoint(client, "https://b.example.com/")
        for n in range(3):
            assert client.post("events", {"type": "invoice.paid", "data": {"n": n}}).status_code == 202
    for delivery in Delivery.objects.filter(tenant=tenant)[:2]:
        DeliveryAttempt.objects.create(delivery=delivery, number=1, started_at=timezone.now(), duration_ms=3,
                                       response_status=500)
    recovery_create(tenant=tenant, endpoint=Endpoint.objects.filter(tenant=tenant).first(),
                    since=timezone.now() - timedelta(hours=1), until=None)
    owned = owned_rows(tenant.pk)
    assert owned["access"] == 1 and owned["recoveries"] == 1 and owned["deliveries"] == 6 and owned["keys"] >= 5
    other = other_api.credential.tenant
    others_before = owned_rows(other.pk)

    # when: it is deleted and beat's erasure runs once its grace is over
    tenant_delete(tenant=tenant)
    Tenant.objects.filter(pk=tenant.pk).update(deleted_at=timezone.now() - erasure_grace() - timedelta(seconds=1))
    erased = tenants_erase(max_seconds=60, pause_ratio=0, batch=2)

    # then: every row it owned is gone, and it too; the other tenant has all of its own
    assert not Tenant.objects.filter(pk=tenant.pk).exists()
    assert all(count == 0 for count in owned_rows(tenant.pk).values()), owned_rows(tenant.pk)
    assert erased.events == 3 and erased.deliveries == 6
    assert erased.rows == sum(owned.values()) - owned["tenant"]  # every row it owned, its own row aside
    assert owned_rows(other.pk) == others_before
