"""RFC 9457 problem+json errors with the stable `code`s of SPEC §5."""
import json
import sys

import psycopg
from django import db

from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback


PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://herald.dev/problems/"

TITLES = {
    "not_authenticated": "Authentication required",
    "not_found": "Not found",
    "validation_error": "Invalid request",
    "payload_too_large": "Payload too large",
    "unsupported_media_type": "Unsupported media type",
    "method_not_allowed": "Method not allowed",
    "idempotency_key_missing": "Idempotency-Key header missing",
    "idempotency_key_invalid": "Idempotency-Key header invalid",
    "idempotency_key_reused": "Idempotency-Key reused with another request",
    "idempotency_key_in_progress": "A request with this Idempotency-Key is in progress",
    "throttled": "Too many requests",
    "too_many_waits": "Too many long-polls waiting",
    "request_timeout": "Request timeout",
    "request_header_fields_too_large": "Request header fields too large",
    "uri_too_long": "URI too long",
    "malformed_request": "Malformed HTTP request",
    "permission_denied": "Permission denied",
    "forbidden": "Forbidden",
    "tenant_required": "A tenant is required",
    "conflict": "Conflict",
    "recovery_in_progress": "A recovery of this endpoint is running",
    "server_error": "Internal server error",
    "database_unavailable": "Database unavailable",
}

# Seconds a client is asked to wait when the database is unavailable (a failover takes about 10 s; a
# client retrying every 2 s with the same Idempotency-Key gets its answer soon after the new primary serves).
DATABASE_RETRY_AFTER_SECONDS = 2


def problem_body(*, status_code: int, code: str, detail: str, errors: dict | None = None) -> dict:
    body = {
        "type": PROBLEM_TYPE_BASE + code.replace("_", "-"),
        "title": TITLES.get(code, code.replace("_", " ").capitalize()),
        "status": status_code,
        "detail": detail,
        "code": code,
    }
    if errors is not None:
        body["errors"] = errors
    return body


def problem_response(*, status_code: int, code: str, detail: str, headers: dict | None = None) -> HttpResponse:
    """A plain Django problem response, for answers given before any DRF view runs."""
    response = HttpResponse(
        json.dumps(problem_body(status_code=status_code, code=code, detail=detail), separators=(",", ":")),
        status=status_code,
        content_type=PROBLEM_CONTENT_TYPE,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _code_for(exc: exceptions.APIException) -> str:
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        return "not_authenticated"
    if isinstance(exc, exceptions.NotFound):
        return "not_found"
    if isinstance(exc, (exceptions.ValidationError, exceptions.ParseError)):
        return "validation_error"
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return "unsupported_media_type"
    if isinstance(exc, exceptions.MethodNotAllowed):
        return "method_not_allowed"
    if isinstance(exc, exceptions.Throttled):
        return "throttled"
    if isinstance(exc, Forbidden):
        return "forbidden"
    if isinstance(exc, exceptions.PermissionDenied):
        return "permission_denied"
    return getattr(exc, "default_code", "error")


def _field_errors(detail) -> dict:
    if isinstance(detail, dict):
        return {key: _field_errors(value) if isinstance(value, dict) else [str(v) for v in _as_list(value)]
                for key, value in detail.items()}
    return {"non_field_errors": [str(v) for v in _as_list(detail)]}


def _as_list(value) -> list:
    if isinstance(value, list):
        out = []
        for item in value:
            out.extend(_as_list(item) if isinstance(item, list) else [item])
        return out
    return [value]


def problem_exception_handler(exc, context):
    """DRF exception handler: every error becomes problem+json with a stable `code`."""
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = _code_for(exc) if isinstance(exc, exceptions.APIException) else "not_found"
    if isinstance(exc, exceptions.ValidationError):
        detail, errors = "The request body did not validate.", _field_errors(exc.detail)
    else:
        raw = getattr(exc, "detail", None) or str(exc)
        detail, errors = str(raw), None
    set_rollback()
    problem = Response(
        problem_body(status_code=response.status_code, code=code, detail=detail, errors=errors),
        status=response.status_code,
        headers={k: v for k, v in response.items() if k.lower() in {"www-authenticate", "retry-after", "allow"}},
        content_type=PROBLEM_CONTENT_TYPE,
    )
    return problem


class NotFound(exceptions.NotFound):
    """Another tenant's object, or none at all: always 404, never 403 (SPEC §2)."""

    default_detail = "No such object."


class Forbidden(exceptions.PermissionDenied):
    """403 `forbidden`: this kind of credential may not make this call (SPEC §10)."""

    default_code = "forbidden"


class TenantRequired(exceptions.APIException):
    """400 `tenant_required`: a platform credential called a tenant's path without /tenants/{tenant}."""

    status_code = 400
    default_code = "tenant_required"
    default_detail = "A platform credential acts for a tenant under /api/v1/tenants/{tenant}/."


class Conflict(exceptions.APIException):
    """409 `conflict`: the object clashes with another (a tenant uid already taken), or its state does not
    allow the call now (a recovery of a disabled endpoint)."""

    status_code = 409
    default_code = "conflict"
    default_detail = "This conflicts with an existing object."


class RecoveryInProgress(Conflict):
    """409 `recovery_in_progress`: a recovery of this endpoint is running (SPEC §11); wait for it to complete."""

    default_code = "recovery_in_progress"
    default_detail = "A recovery of this endpoint is running."


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether `exc` says the database could not serve: no connection, a connection lost or cut (a
    restart, a failover), a server starting or shutting down, a node that no longer accepts writes
    (read-only after a demotion), or a statement cancelled by its timeout. Not a bug of ours: the same
    request may succeed in a moment."""
    while exc is not None:
        if isinstance(exc, (db.OperationalError, db.InterfaceError, psycopg.OperationalError,
                            psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction)):
            return True
        exc = exc.__cause__
    return False


def server_error(request, *args, **kwargs) -> HttpResponse:
    """handler500: problem+json like every other error (SPEC §5), never Django's HTML page.

    Django calls it while handling the exception, so the exception is at hand: when the database could not
    serve (database_unavailable), the answer is 503 `database_unavailable` with `Retry-After`, so clients and
    proxies retry (with the same Idempotency-Key: the failed request left no key behind)."""
    if database_unavailable(sys.exc_info()[1]):
        return problem_response(status_code=503, code="database_unavailable",
                                detail="The database is unavailable for a moment (a restart or a failover); "
                                       "retry with the same Idempotency-Key.",
                                headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)})
    return problem_response(status_code=500, code="server_error",
                            detail="Something went wrong on our side; retry with the same Idempotency-Key.")


def not_found(request, exception=None) -> HttpResponse:
    """handler404 for URLs that match no route."""
    return problem_response(status_code=404, code="not_found", detail=f"No route for {request.path}.")


class TooManyWaits(exceptions.APIException):
    """429 `too_many_waits`: the credential or the poll endpoint already has as many long-polls waiting as
    POLL_MAX_WAITS_PER_CREDENTIAL / POLL_MAX_WAITS_PER_ENDPOINT allow (intake/waits.py); `Retry-After` is
    when the first of them ends at the latest."""

    status_code = 429
    default_code = "too_many_waits"

    def __init__(self, detail: str, wait: int):
        super().__init__(detail)
        self.wait = wait   # DRF's handler sends it as Retry-After
