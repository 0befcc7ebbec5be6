"""Beat's erasure of a deleted tenant against real PostgreSQL: everything it owns goes, whatever its endpoints
were given (extra headers, auth, a recovery), and nothing of another tenant."""
from datetime import timedelta

import pytest
from django.utils import timezone

from intake.models import ApiCredential, IdempotencyKey
from intake.tenants import erasure_grace, tenant_delete, tenants_erase
from tests.conftest import create_endpoint
from webhooks.models import (Delivery, DeliveryAttempt, DeliveryOutbox, Endpoint, EndpointAccess, EndpointSecret, Event,
                             Recovery, Tenant)
from webhooks.services.recovery import recovery_create

pytestmark = pytest.mark.django_db(transaction=True)


def _owned(tenant_id: str) -> dict[str, int]:
    return {
        "events": Event.objects.filter(tenant_id=tenant_id).count(),
        "deliveries": Delivery.objects.filter(tenant_id=tenant_id).count(),
        "attempts": DeliveryAttempt.objects.filter(delivery__tenant_id=tenant_id).count(),
        "outbox": DeliveryOutbox.objects.filter(delivery__tenant_id=tenant_id).count(),
        "endpoints": Endpoint.objects.filter(tenant_id=tenant_id).count(),
        "secrets": EndpointSecret.objects.filter(endpoint__tenant_id=tenant_id).count(),
        "access": EndpointAccess.objects.filter(endpoint__tenant_id=tenant_id).count(),
        "recoveries": Recovery.objects.filter(tenant_id=tenant_id).count(),
        "credentials": ApiCredential.objects.filter(tenant_id=tenant_id).count(),
        "keys": IdempotencyKey.objects.filter(credential__tenant_id=tenant_id).count(),
    }


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
    owned = _owned(tenant.pk)
    assert owned["access"] == 1 and owned["recoveries"] == 1 and owned["deliveries"] == 6 and owned["keys"] >= 5
    other = other_api.credential.tenant
    others_before = _owned(other.pk)

    # when: it is deleted and beat's erasure runs once its grace is over
    tenant_delete(tenant=tenant)
    Tenant.objects.filter(pk=tenant.pk).update(deleted_at=timezone.now() - erasure_grace() - timedelta(seconds=1))
    erased = tenants_erase(max_seconds=60, pause_ratio=0, batch=2)

    # then: every row it owned is gone, and it too; the other tenant has all of its own
    assert not Tenant.objects.filter(pk=tenant.pk).exists()
    assert all(count == 0 for count in _owned(tenant.pk).values()), _owned(tenant.pk)
    assert erased.events == 3 and erased.deliveries == 6
    assert erased.rows == sum(owned.values())
    assert _owned(other.pk) == others_before
