"""Selectors of the delivery side: functions that read, always scoped to one tenant."""
from datetime import datetime

from django.db.models import Prefetch, QuerySet

from webhooks.delivery import signing

from webhooks.models import (Delivery, DeliveryAttempt, Endpoint, EndpointAccess, EndpointSecret, Event, EventType,
                             Recovery, Tenant)


def endpoint_list(*, tenant: Tenant) -> QuerySet[Endpoint]:
    return Endpoint.objects.filter(tenant=tenant, deleted_at__isnull=True).select_related("access")


def endpoint_access(*, endpoint: Endpoint) -> EndpointAccess | None:
    """The endpoint's headers, auth and client certificate, if it has any (never decrypted here)."""
    try:
        return endpoint.access
    except EndpointAccess.DoesNotExist:
        return None


def endpoint_get(*, tenant: Tenant, endpoint_id: str) -> Endpoint | None:
    return endpoint_list(tenant=tenant).filter(pk=endpoint_id).first()


def endpoint_secret(*, endpoint: Endpoint) -> str:
    """The endpoint's current signing secret (the newest), decrypted: for `GET …/secret` only."""
    return EndpointSecret.objects.filter(endpoint=endpoint).order_by("-created_at", "-id").first().secret


def endpoint_secret_shown(*, endpoint: Endpoint) -> dict[str, str]:
    """What `GET …/secret` shows: `{secret}` for a v1 (HMAC) secret, `{public_key}` for a v1a ed25519 key,
    whose private half never leaves Herald."""
    secret = endpoint_secret(endpoint=endpoint)
    if signing.scheme_of(secret) == signing.V1A:
        return {"public_key": signing.public_key(secret)}
    return {"secret": secret}


def _created(queryset: QuerySet, after: datetime | None, before: datetime | None) -> QuerySet:
    """[after, before): `?created_after=` is inclusive, `?created_before=` exclusive."""
    if after is not None:
        queryset = queryset.filter(created_at__gte=after)
    if before is not None:
        queryset = queryset.filter(created_at__lt=before)
    return queryset


def event_list(*, tenant: Tenant, event_type: str | None = None, created_after: datetime | None = None,
               created_before: datetime | None = None) -> QuerySet[Event]:
    # (the body is loaded: an event's `data` is read from it)
    events = Event.objects.filter(tenant=tenant).prefetch_related(
        Prefetch("deliveries", queryset=Delivery.objects.only("id", "event_id", "endpoint_id", "status")
                 .order_by("id")))
    if event_type:
        events = events.filter(type=event_type)
    return _created(events, created_after, created_before)


def event_get(*, tenant: Tenant, event_id: str) -> Event | None:
    return event_list(tenant=tenant).filter(pk=event_id).first()


def delivery_list(*, tenant: Tenant, status: str | None = None, endpoint_id: str | None = None,
                  event_id: str | None = None, created_after: datetime | None = None,
                  created_before: datetime | None = None) -> QuerySet[Delivery]:
    deliveries = Delivery.objects.filter(tenant=tenant)
    if status:
        deliveries = deliveries.filter(status=status)
    if endpoint_id:
        deliveries = deliveries.filter(endpoint_id=endpoint_id)
    if event_id:
        deliveries = deliveries.filter(event_id=event_id)
    return _created(deliveries, created_after, created_before)


def delivery_get(*, tenant: Tenant, delivery_id: str) -> Delivery | None:
    return (Delivery.objects.filter(tenant=tenant, pk=delivery_id)
            .prefetch_related(Prefetch("attempts", queryset=DeliveryAttempt.objects.order_by("number")))
            .first())


def event_type_list() -> QuerySet[EventType]:
    """The deployment's event-type catalog (not scoped to a tenant: every tenant reads the same one)."""
    return EventType.objects.all()


def event_type_get(*, name: str) -> EventType | None:
    return EventType.objects.filter(name=name).first()


def recovery_get(*, tenant: Tenant, recovery_id: str) -> Recovery | None:
    return Recovery.objects.filter(tenant=tenant, pk=recovery_id).first()


def recovery_latest(*, tenant: Tenant, endpoint_id: str) -> Recovery | None:
    """The endpoint's newest recovery (the portal shows its progress)."""
    return Recovery.objects.filter(tenant=tenant, endpoint_id=endpoint_id).order_by("-id").first()
