"""What a tenant owns, counted table by table: the erasure tests' picture of "everything" (SPEC §10)."""
from intake.models import ApiCredential, IdempotencyKey
from webhooks.models import (Delivery, DeliveryAttempt, DeliveryOutbox, Endpoint, EndpointAccess, EndpointSecret, Event,
                             PortalLink, Recovery, Tenant)


def owned_rows(tenant_id: str) -> dict[str, int]:
    """Rows of every table a tenant's data lives in, by table, for `tenant_id` (its own row included)."""
    return {
        "tenant": Tenant.objects.filter(pk=tenant_id).count(),
        "endpoints": Endpoint.objects.filter(tenant_id=tenant_id).count(),
        "secrets": EndpointSecret.objects.filter(endpoint__tenant_id=tenant_id).count(),
        "access": EndpointAccess.objects.filter(endpoint__tenant_id=tenant_id).count(),
        "recoveries": Recovery.objects.filter(tenant_id=tenant_id).count(),
        "events": Event.objects.filter(tenant_id=tenant_id).count(),
        "deliveries": Delivery.objects.filter(tenant_id=tenant_id).count(),
        "attempts": DeliveryAttempt.objects.filter(delivery__tenant_id=tenant_id).count(),
        "outbox": DeliveryOutbox.objects.filter(delivery__tenant_id=tenant_id).count(),
        "credentials": ApiCredential.objects.filter(tenant_id=tenant_id).count(),
        "keys": IdempotencyKey.objects.filter(credential__tenant_id=tenant_id).count(),
        "portal_links": PortalLink.objects.filter(tenant_id=tenant_id).count(),
    }
