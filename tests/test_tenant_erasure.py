"""Beat's erasure of a deleted tenant against real PostgreSQL: everything it owns goes, whatever its endpoints
were given (extra headers, auth, a recovery), the admin's history of its rows too, and nothing of another tenant."""
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.utils import timezone

from intake.credentials import credential_create_platform
from intake.models import ApiCredential, IdempotencyKey
from intake.tenants import erasure_grace, tenant_delete, tenants_erase
from tests.conftest import Api, create_endpoint
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
    # and answers the platform stored under its own keys for it (SPEC §10: they are the tenant's too)
    platform = Api(*reversed(credential_create_platform(name="erasure platform")))
    assert platform.post(f"tenants/{tenant.pk}/events", {"type": "invoice.paid", "data": {"n": "p"}}).status_code == 202
    assert platform.patch(f"tenants/{tenant.pk}", {"name": "renamed"}).status_code == 200
    assert IdempotencyKey.objects.filter(tenant=tenant).count() == 2
    owned = owned_rows(tenant.pk)
    assert owned["webhooks.EndpointAccess"] == 1 and owned["webhooks.Recovery"] == 1
    assert owned["webhooks.Delivery"] == 8 and owned["intake.IdempotencyKey"] >= 7
    other = other_api.credential.tenant
    others_before = owned_rows(other.pk)

    # when: it is deleted and beat's erasure runs once its grace is over
    tenant_delete(tenant=tenant)
    Tenant.objects.filter(pk=tenant.pk).update(deleted_at=timezone.now() - erasure_grace() - timedelta(seconds=1))
    erased = tenants_erase(max_seconds=60, pause_ratio=0, batch=2)

    # then: every row it owned is gone, and it too; the other tenant has all of its own
    assert not Tenant.objects.filter(pk=tenant.pk).exists()
    assert all(count == 0 for count in owned_rows(tenant.pk).values()), owned_rows(tenant.pk)
    assert erased.events == 4 and erased.deliveries == 8
    assert erased.rows == sum(owned.values()) - owned["webhooks.Tenant"]  # every row it owned, its own row aside
    assert owned_rows(other.pk) == others_before


def test_the_admins_history_of_a_tenants_rows_goes_with_it_and_never_held_a_query(api, other_api):
    # given: an operator changed, in the admin, rows of two tenants (the admin's own LogEntry records)
    operator = User.objects.create_superuser("ops", "ops@example.com", "right-password-123")
    tenant, other = api.credential.tenant, other_api.credential.tenant
    mine = create_endpoint(api, "https://a.example.com/hook?token=receiver-secret-1")
    theirs = create_endpoint(other_api, "https://b.example.com/hook?token=receiver-secret-2")
    assert api.post("events", {"type": "invoice.paid", "data": {}}).status_code == 202
    for queryset in (Tenant.objects.filter(pk=tenant.pk), Endpoint.objects.filter(pk=mine["id"]),
                     ApiCredential.objects.filter(pk=api.credential.pk), Delivery.objects.filter(tenant=tenant),
                     Endpoint.objects.filter(pk=theirs["id"]), Tenant.objects.filter(pk=other.pk)):
        LogEntry.objects.log_actions(operator.pk, queryset, CHANGE, change_message="[]")
    assert not LogEntry.objects.filter(object_repr__contains="secret").exists()  # str() of an endpoint: no query
    kept = set(LogEntry.objects.filter(object_id__in=[theirs["id"], str(other.pk)]).values_list("pk", flat=True))
    assert LogEntry.objects.count() == len(kept) + 4

    # when: the tenant is deleted and erased
    tenant_delete(tenant=tenant)
    Tenant.objects.filter(pk=tenant.pk).update(deleted_at=timezone.now() - erasure_grace() - timedelta(seconds=1))
    tenants_erase(max_seconds=60, pause_ratio=0, batch=2)

    # then: its history is gone, the other tenant's kept
    assert not Tenant.objects.filter(pk=tenant.pk).exists()
    assert set(LogEntry.objects.values_list("pk", flat=True)) == kept


@pytest.mark.parametrize("url,shown", [
    ("https://hooks.example.com/in?token=abc#x", "https://hooks.example.com/in"),
    ("https://user:pass@hooks.example.com:8443/in", "https://hooks.example.com:8443/in"),
    ("http://[2001:db8::1]:8080/a;b?c=d", "http://[2001:db8::1]:8080/a;b"),
])
def test_an_endpoint_is_shown_without_query_or_user_info(url, shown):
    assert str(Endpoint(id="ep_1", url=url)) == f"ep_1 {shown}"


def test_what_a_tenant_owns_is_every_model_with_a_key_leading_to_it():
    """tests/tenant_rows.py finds the models from the app registry: the hand-written list it replaced missed
    DeliveryLease; the platform's keys for a tenant are found by their own column."""
    from tests.tenant_rows import tenant_models

    owned = tenant_models()
    assert {"webhooks.DeliveryLease", "webhooks.EndpointSecret", "webhooks.DeliveryAttempt",
            "intake.ApiCredential"} <= set(owned)
    assert set(owned["intake.IdempotencyKey"]) == {"credential__tenant_id", "tenant_id"}
    assert "webhooks.EventType" not in owned  # the deployment's catalog is no tenant's
