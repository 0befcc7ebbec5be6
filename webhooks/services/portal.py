"""One-time links into a tenant's portal: issued by the API (POST /api/v1/portal-links), redeemed once."""
import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webhooks.models import PortalLink, Tenant


def _hash(token: str) -> str:
    # 256 random bits: a fast hash is enough, there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def portal_link_create(*, tenant: Tenant) -> tuple[PortalLink, str]:
    """A link valid for PORTAL_LINK_SECONDS; the link and its token (never stored, only hashed)."""
    token = secrets.token_urlsafe(32)
    link = PortalLink.objects.create(tenant=tenant, token_hash=_hash(token),
                                     expires_at=timezone.now() + timedelta(seconds=settings.PORTAL_LINK_SECONDS))
    return link, token


def portal_link_redeem(*, token: str) -> str | None:
    """The tenant id the link opens, once: None if it is unknown, used or expired. One conditional
    UPDATE, so two clicks at the same moment open it at most once."""
    now = timezone.now()
    opened = PortalLink.objects.filter(token_hash=_hash(token), used_at__isnull=True, expires_at__gt=now)
    if not opened.update(used_at=now):
        return None
    return PortalLink.objects.filter(token_hash=_hash(token)).values_list("tenant_id", flat=True).first()


def portal_link_usable(*, token: str) -> bool:
    """Whether the link would open now (a read: it stays unused)."""
    return PortalLink.objects.filter(token_hash=_hash(token), used_at__isnull=True,
                                     expires_at__gt=timezone.now()).exists()
