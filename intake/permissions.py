"""Who may call what: the request carries a live API credential (there are no user accounts on the API),
of the kind the path is for (SPEC §10).

A tenant credential acts on its tenant through the paths of §4; a platform credential manages tenants
and acts for one under /api/v1/tenants/{tenant}/. The rule is `scope_refusal`, applied to writes by the
idempotency middleware before any key is taken (so a refusal is never stored), and to every call by
DRF's permission check.
"""
from rest_framework.exceptions import APIException
from rest_framework.permissions import BasePermission

PLATFORM_PATH = "/api/v1/tenants"


def is_platform_path(path: str) -> bool:
    return path == PLATFORM_PATH or path.startswith(PLATFORM_PATH + "/")


def scope_refusal(credential, path: str) -> APIException | None:
    """Why this credential may not call this /api/v1/ path, or None if it may."""
    from intake.problems import Forbidden, TenantRequired  # (not at import: DRF loads this module early)

    if is_platform_path(path):
        if not credential.is_platform:
            return Forbidden("A tenant credential cannot call /api/v1/tenants; a platform credential can.")
        return None
    if credential.is_platform:
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
