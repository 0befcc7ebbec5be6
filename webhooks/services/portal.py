"""One-time links into a tenant's portal: issued by the API (POST /api/v1/portal-links), redeemed once."""
import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone

from webhooks.conf import herald_settings
from webhooks.models import PortalLink, Tenant


def _hash(token: str) -> str:
    # 256 random bits: a fast hash is enough, there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def portal_link_create(*, tenant: Tenant, credential_id: int | None = None,
                       theme: dict | None = None) -> tuple[PortalLink, str]:
    """A link valid for PORTAL_LINK_SECONDS, made by that API credential, whose session shows `theme`
    ({name?, logo_url?, accent?}, checked by the caller); the link and its token (never stored, only
    hashed)."""
    token = secrets.token_urlsafe(32)
    link = PortalLink.objects.create(tenant=tenant, token_hash=_hash(token), credential_id=credential_id,
                                     theme=theme or {},
                                     expires_at=timezone.now()
                                     + timedelta(seconds=herald_settings.portal.PORTAL_LINK_SECONDS))
    return link, token


def _openable(token: str):
    return PortalLink.objects.filter(token_hash=_hash(token), used_at__isnull=True, ended_at__isnull=True,
                                     expires_at__gt=timezone.now(), tenant__deleted_at__isnull=True)


def portal_link_redeem(*, token: str) -> tuple[int, str, dict] | None:
    """The link's id, the tenant id it opens and its theme, once: None if it is unknown, used, expired or ended
    (its credential revoked, its tenant deleted). One conditional UPDATE, so two clicks at the same
    moment open it at most once."""
    if not _openable(token).update(used_at=timezone.now()):
        return None
    return PortalLink.objects.filter(token_hash=_hash(token)).values_list("id", "tenant_id", "theme").first()


def portal_link_usable(*, token: str) -> bool:
    """Whether the link would open now (a read: it stays unused)."""
    return _openable(token).exists()


def portal_session_tenant(*, link_id: int | None, tenant_id: str) -> Tenant | None:
    """The tenant of a portal session opened by that link, if the session may go on: the tenant is not
    deleted and the link not ended (its credential revoked). None otherwise. A session opened before
    links were recorded in it (`link_id` None) is checked on its tenant alone."""
    if link_id is None:
        return Tenant.objects.filter(pk=tenant_id, deleted_at__isnull=True).first()
    link = (PortalLink.objects.select_related("tenant")
            .filter(pk=link_id, tenant_id=tenant_id, ended_at__isnull=True, tenant__deleted_at__isnull=True).first())
    return None if link is None else link.tenant


def portal_links_end(*, credential_ids: list[int] | None = None, tenant: Tenant | None = None) -> int:
    """End the links made by these credentials (or every link of the tenant), and so the portal sessions
    they opened."""
    links = PortalLink.objects.filter(ended_at__isnull=True)
    links = links.filter(credential_id__in=credential_ids) if credential_ids is not None else links.filter(tenant=tenant)
    return links.update(ended_at=timezone.now())
