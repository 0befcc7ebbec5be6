"""Who may call what: the request carries a live API credential (there are no user accounts on the API),
of the kind the path is for (SPEC §10).

A tenant credential acts on its tenant through the paths of §4; a platform credential manages tenants
and acts for one under /api/v1/tenants/{tenant}/. The rule is `scope_refusal`, applied to writes by the
idempotency middleware before any key is taken (so a refusal is never stored), and to every call by
DRF's permission check. The deployment's own resources (the event-type catalog, SPEC §12) are reached by
every credential; their views say who may write (`ReadByAnyWriteByPlatform`).
"""
from rest_framework.exceptions import APIException
from rest_framework.permissions import SAFE_METHODS, BasePermission

PLATFORM_PATH = "/api/v1/tenants"
DEPLOYMENT_PATHS = ("/api/v1/event-types",)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def is_platform_path(path: str) -> bool:
    return _under(path, PLATFORM_PATH)


def credential_is_platform(credential) -> bool:
    """The one place that says whether a credential is the platform's: its `kind` (SPEC §10)."""
    return getattr(credential, "is_platform", False)


def scope_refusal(credential, path: str) -> APIException | None:
    """Why this credential may not call this /api/v1/ path, or None if it may."""
    from intake.problems import Forbidden, TenantRequired  # (not at import: DRF loads this module early)

    if is_platform_path(path):
        if not credential_is_platform(credential):
            return Forbidden("A tenant credential cannot call /api/v1/tenants; a platform credential can.")
        return None
    if any(_under(path, prefix) for prefix in DEPLOYMENT_PATHS):
        return None
    if credential_is_platform(credential):
        return TenantRequired()
    return None


class HasCredential(BasePermission):
    def has_permission(self, request, view) -> bool:
        if request.auth is None:
            return False
        refusal = scope_refusal(request.auth, request.path)
        if refusal is not None:
            raise refusal
        return True


class IsPlatformCredential(HasCredential):
    """Only a platform credential; a tenant's gets 403 `forbidden` (none at all: 401)."""

    def has_permission(self, request, view) -> bool:
        from intake.problems import Forbidden

        if not super().has_permission(request, view):
            return False
        if not credential_is_platform(request.auth):
            raise Forbidden("Only a platform credential may do this.")
        return True


class ReadByAnyWriteByPlatform(IsPlatformCredential):
    """Any credential may read (GET, HEAD, OPTIONS); only a platform credential may write."""

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return HasCredential.has_permission(self, request, view)
        return super().has_permission(request, view)
