"""Who may call what: the request carries a live API credential (there are no user accounts on the API),
of the kind the path is for (SPEC §10).

A tenant credential acts on its tenant through the paths of §4; a platform credential manages tenants
and acts for one under /api/v1/tenants/{tenant}/. The rule is `scope_refusal`, applied to writes by the
idempotency middleware before any key is taken (so a refusal is never stored), and to every call by
DRF's permission check. The deployment's own resources (the event-type catalog, SPEC §12) are reached by
every credential; their views say who may write (`ReadByAnyWriteByPlatform`).

The rule reads the route the request is served by, never `request.path`: that one begins with SCRIPT_NAME,
the mount point the WSGI server was told, which is no part of routing (SPEC §2). DRF's check gives it the
URL pattern Django resolved (`request_route`); the idempotency layer, before routing, `path_info` itself,
which routes the same (the API's patterns are literal prefixes) without resolving on the hot path. The views check the credential's kind once more
themselves (intake/views.py), so a slip here is not yet a tenant acting as the platform.
"""
from django.http import HttpRequest
from django.urls import Resolver404, resolve
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


def request_route(request: HttpRequest):
    """(the route's path, its arguments): the pattern this request is routed by, as a path
    (`/api/v1/tenants/<str:tenant>/events`), and the values it took (`{"tenant": "acme"}`). Resolved
    from `path_info` as Django's handler resolves it (the view's own `resolver_match` once there); a path
    no route takes is its own route, without arguments (it is answered 404)."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return request.path_info, {}
    return "/" + match.route, match.kwargs


def scope_refusal(credential, path: str) -> APIException | None:
    """Why this credential may not call the route `path` (request_route's), or None if it may."""
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
        refusal = scope_refusal(request.auth, request_route(request)[0])
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
