"""Services for API credentials: issue a token (shown once), revoke, and resolve a presented one."""
import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from intake.models import ApiCredential
from webhooks.models import Tenant

TOKEN_PREFIX = "hrld_"


def _hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def credential_create(*, tenant_name: str, name: str = "") -> tuple[ApiCredential, str]:
    """Create a credential for the tenant (creating the tenant if new); return it and its token."""
    tenant, _ = Tenant.objects.get_or_create(name=tenant_name)
    return credential_issue(tenant=tenant, name=name)


def credential_issue(*, tenant: Tenant, name: str = "") -> tuple[ApiCredential, str]:
    """Create a credential for an existing tenant; return it and its token (never stored, only hashed)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    credential = ApiCredential.objects.create(
        tenant=tenant, name=name, token_prefix=token[: len(TOKEN_PREFIX) + 6], token_hash=_hash_token(token)
    )
    return credential, token


def credentials_revoke(*, credential_ids: list[int]) -> int:
    """Revoke the live credentials among these ids at once; return how many were revoked."""
    return ApiCredential.objects.filter(pk__in=credential_ids, revoked_at__isnull=True).update(
        revoked_at=timezone.now())


def credential_from_authorization(header: str | None) -> ApiCredential | None:
    """Return the live credential named by an `Authorization: Bearer …` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 200:
        return None
    return (
        ApiCredential.objects.select_related("tenant")
        .filter(token_hash=_hash_token(token), revoked_at__isnull=True)
        .first()
    )
