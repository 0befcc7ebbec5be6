"""Permissions: the request carries a live API credential (there are no user accounts on the API), and
which credentials are the platform's (SPEC §10)."""
from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

PLATFORM = "platform"


class Forbidden(exceptions.PermissionDenied):
    """The credential is valid but of the wrong kind for this call (SPEC §10): 403 `forbidden`.
    (Here, not in intake.problems: DRF imports this module while its views module is half-loaded.)"""

    default_code = "forbidden"


def credential_is_platform(credential) -> bool:
    """The one place that says whether a credential is the platform's: its `kind` (SPEC §10)."""
    return getattr(credential, "kind", None) == PLATFORM


class HasCredential(BasePermission):
    def has_permission(self, request, view) -> bool:
        return request.auth is not None


class IsPlatformCredential(BasePermission):
    """Only a platform credential; a tenant's gets 403 `forbidden` (none at all: 401)."""

    def has_permission(self, request, view) -> bool:
        if request.auth is None:
            return False
        if not credential_is_platform(request.auth):
            raise Forbidden("Only a platform credential may do this.")
        return True


class ReadByAnyWriteByPlatform(IsPlatformCredential):
    """Any credential may read (GET, HEAD, OPTIONS); only a platform credential may write."""

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return request.auth is not None
        return super().has_permission(request, view)
