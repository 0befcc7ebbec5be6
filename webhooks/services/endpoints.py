"""Endpoint services: create, update, delete (cancelling pending deliveries), rotate the secret."""
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webhooks.models import Delivery, Endpoint, EndpointSecret, Tenant
from webhooks.signing import generate_secret
from webhooks.transport import check_url_host

# How long a rotated-out secret keeps signing, so receivers can roll over (Svix does the same).
OLD_SECRET_GRACE = timedelta(hours=24)


class EndpointUrlRefused(ValueError):
    """The URL is not http(s), or its host resolves to an address Herald may not call."""


def endpoint_url_check(*, url: str) -> None:
    """Refuse URLs that are not http(s) or point into private networks (unless allowed)."""
    if settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS:
        if not url.lower().startswith(("http://", "https://")):
            raise EndpointUrlRefused("The URL must use http or https.")
        return
    try:
        check_url_host(url)
    except ValueError as exc:
        raise EndpointUrlRefused(str(exc)) from None


@transaction.atomic
def endpoint_create(*, tenant: Tenant, url: str, event_types: list[str], channels: list[str],
                    description: str = "") -> Endpoint:
    """Create an endpoint with a fresh `whsec_` secret."""
    endpoint_url_check(url=url)
    endpoint = Endpoint.objects.create(tenant=tenant, url=url, event_types=event_types, channels=channels,
                                       description=description)
    secret = EndpointSecret.objects.create(endpoint=endpoint, secret=generate_secret())
    endpoint.current_secret = secret.secret
    return endpoint


UPDATABLE_FIELDS = ("url", "event_types", "channels", "description", "enabled")


def endpoint_update(*, endpoint: Endpoint, **changes) -> Endpoint:
    """Apply a partial update; re-enabling clears the failure record."""
    unknown = set(changes) - set(UPDATABLE_FIELDS)
    if unknown:
        raise TypeError(f"cannot update {sorted(unknown)}")
    if "url" in changes:
        endpoint_url_check(url=changes["url"])
    for field, value in changes.items():
        setattr(endpoint, field, value)
    if changes.get("enabled") is True:
        endpoint.disabled_reason = ""
        endpoint.failing_since = None
    endpoint.save()
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint: Endpoint) -> int:
    """Soft-delete the endpoint (its delivery history stays readable) and cancel what is pending."""
    now = timezone.now()
    Endpoint.objects.filter(pk=endpoint.pk).update(deleted_at=now, enabled=False, updated_at=now)
    return Delivery.objects.filter(endpoint=endpoint, status=Delivery.PENDING).update(
        status=Delivery.CANCELLED, next_attempt_at=None, updated_at=now)


@transaction.atomic
def endpoint_rotate_secret(*, endpoint: Endpoint) -> Endpoint:
    """Issue a new secret; the ones still active keep signing for 24 h, then expire."""
    now = timezone.now()
    EndpointSecret.objects.filter(endpoint=endpoint).filter(
        expires_at__isnull=True).update(expires_at=now + OLD_SECRET_GRACE)
    secret = EndpointSecret.objects.create(endpoint=endpoint, secret=generate_secret())
    endpoint.current_secret = secret.secret
    return endpoint
