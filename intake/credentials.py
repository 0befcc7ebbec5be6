"""Services for API credentials: issue a token (shown once), revoke, and resolve a presented one."""
import hashlib
import secrets
import time

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from intake.models import ApiCredential
from webhooks.conf import herald_settings
from webhooks.models import Tenant
from webhooks.services.portal import portal_links_end

TOKEN_PREFIX = "hrld_"


def _hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def credential_create(*, tenant_name: str, name: str = "") -> tuple[ApiCredential, str]:
    """Create a credential for the live tenant of that name (the oldest, if several share it; created if
    there is none); return it and its token."""
    tenant = (Tenant.objects.filter(name=tenant_name, deleted_at__isnull=True).order_by("created_at").first()
              or Tenant.objects.create(name=tenant_name))
    return credential_issue(tenant=tenant, name=name)


def credential_issue(*, tenant: Tenant | None, name: str = "") -> tuple[ApiCredential, str]:
    """Create a credential for an existing tenant, or a platform credential when `tenant` is None;
    return it and its token (never stored, only hashed)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    credential = ApiCredential.objects.create(
        kind=ApiCredential.TENANT if tenant is not None else ApiCredential.PLATFORM,
        tenant=tenant, name=name, token_prefix=token[: len(TOKEN_PREFIX) + 6], token_hash=_hash_token(token)
    )
    return credential, token


def credential_create_platform(*, name: str = "") -> tuple[ApiCredential, str]:
    """A platform credential (SPEC §10): it manages every tenant and acts for any of them."""
    return credential_issue(tenant=None, name=name)


@transaction.atomic
def credentials_revoke(*, credential_ids: list[int]) -> int:
    """Revoke the live credentials among these ids at once, and end the portal sessions they opened;
    return how many were revoked."""
    now = timezone.now()
    revoked = ApiCredential.objects.filter(pk__in=credential_ids, revoked_at__isnull=True).update(revoked_at=now)
    portal_links_end(credential_ids=credential_ids)
    credential_cache_clear()
    return revoked


# Live credentials seen recently, by token hash: saves the idempotency layer's POSTs and PATCHes a query
# each. Only it reads them (`cached=True`), because its own statements check again that the credential
# is live (intake/idempotency/store.py), so a revocation holds at once in every process; unknown tokens
# are never cached.
_recent: dict[str, tuple[float, ApiCredential]] = {}


def _bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` header however it is spelled (the scheme in any case, any
    spaces around the token), or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 200:
        return None
    return token


def credential_from_authorization(header: str | None, *, cached: bool = False) -> ApiCredential | None:
    """Return the live credential named by an `Authorization: Bearer …` header, or None.

    `cached`: it may come from this process's lookups of the last CREDENTIAL_CACHE_SECONDS, and so may
    have been revoked since; only for a caller whose statements check that again (the idempotency layer)."""
    token = _bearer_token(header)
    if token is None:
        return None
    digest = _hash_token(token)
    now = time.monotonic()
    hit = _recent.get(digest) if cached else None
    if hit is not None and hit[0] > now:
        return hit[1]
    # A deleted tenant's credentials were revoked with it; asked again all the same, so that none can
    # outlive it whatever wrote it (SPEC §10).
    credential = (ApiCredential.objects.select_related("tenant")
                  .filter(Q(tenant__isnull=True) | Q(tenant__deleted_at__isnull=True),
                          token_hash=digest, revoked_at__isnull=True).first())
    if credential is None:
        _recent.pop(digest, None)
        return None
    if _known.get(digest) is None:
        if len(_known) >= KNOWN_MAX:
            _known.clear()
        _known[digest] = (credential.pk, credential.kind == ApiCredential.PLATFORM)
    if herald_settings.api.CREDENTIAL_CACHE_SECONDS > 0:
        if len(_recent) >= 10_000:
            _recent.clear()
        _recent[digest] = (now + herald_settings.api.CREDENTIAL_CACHE_SECONDS, credential)
    return credential


# Whose turn a request waits in, for the buffered worker's fair turns (config/gunicorn_worker.py), decided in
# its event loop where no query can run: the credentials this process has resolved (by token hash, kept
# without expiry) and the tenants its platform credentials have acted for (by the id or uid a path named).
# For ordering only: a credential revoked since still gets its own queue, and is answered 401 in its turn.
KNOWN_MAX = 10_000
_known: dict[str, tuple[int, bool]] = {}          # token hash -> (credential id, is a platform credential)
_acted_for: dict[tuple[int, str], str] = {}       # (platform credential id, tenant id or uid in a path) -> tenant id
ACTING_PREFIX = b"/api/v1/tenants/"


def credential_acted_for(*, credential_id: int, ref: str, tenant_id: str) -> None:
    """A platform credential acted for the tenant `ref` (its id or uid, as a /tenants/{ref}/ path named it) names."""
    if len(_acted_for) >= KNOWN_MAX:
        _acted_for.clear()
    _acted_for[(credential_id, ref)] = tenant_id


def credential_turn(authorization: bytes | None, target: bytes) -> tuple:
    """The queue a whole request waits in for a thread: (credential id,) for a tenant credential this process
    has resolved before, (credential id, tenant id) for a platform credential acting for a tenant it has acted
    for before (by the same id or uid; (credential id, "") otherwise), and () for every other request, those
    that name no credential (none, a wrong one, garbage) or one not seen yet, which share one queue. However the
    header spells the token, and whatever a client makes up, it gets no more queues than its credentials."""
    token = _bearer_token(authorization.decode("latin-1")) if authorization else None
    known = _known.get(_hash_token(token)) if token is not None else None
    if known is None:
        return ()
    credential_id, platform = known
    if not platform:
        return (credential_id,)
    path = target.split(b"?", 1)[0]
    if path.startswith(ACTING_PREFIX):
        ref = path[len(ACTING_PREFIX):].split(b"/", 1)[0].decode("latin-1")
        return (credential_id, _acted_for.get((credential_id, ref), ""))
    return (credential_id, "")


def credential_cache_clear() -> None:
    """Forget cached credentials in this process (after a revocation here, and between tests)."""
    _recent.clear()
