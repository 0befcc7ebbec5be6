"""Exceptions: one class per stable problem+json `code` of Herald's API, and the client's own.

Every error answer of Herald is `application/problem+json` with a stable `code`; the client raises
the class registered for that code (`NotFound` for `not_found`, …), so callers catch what they mean:

    try:
        herald.endpoints.get("ep_…")
    except herald_client.NotFound:
        ...

All of them are `APIError`s (with `status`, `code`, `title`, `detail`, `errors`, `headers`), and
every exception this package raises is a `HeraldError`.
"""
from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from standardwebhooks.webhooks import WebhookVerificationError as _StandardVerificationError


class HeraldError(Exception):
    """Base class of every exception raised by this package."""


class HeraldConnectionError(HeraldError):
    """No answer from Herald after every attempt (refused, reset, timed out); `__cause__` is the last
    network error. The call may or may not have executed: call again with the same `idempotency_key`."""

    def __init__(self, message: str, *, attempts: int, idempotency_key: str | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.idempotency_key = idempotency_key


class WebhookVerificationError(HeraldError, _StandardVerificationError):
    """`verify()` refused a webhook: a missing or malformed header, no matching signature, a timestamp
    more than the tolerance away, or a body that is not the JSON that was signed. Answer it with 400.

    It is also a `standardwebhooks` `WebhookVerificationError`, so code written for that package
    catches it unchanged."""


class APIError(HeraldError):
    """Herald answered with an error (problem+json, RFC 9457).

    `code` is the stable machine-readable code (`None` when the answer was not problem+json, e.g. a
    proxy's 502 page); `errors` maps fields (or JSON pointers) to messages for `validation_error`;
    `idempotency_key` is the key the call was sent with (None for GET and DELETE); `attempts` how many
    times it was sent.
    """

    code: str | None = None  # the class's code; an instance carries the code of the answer it was made from
    default_status: ClassVar[int | None] = None

    def __init__(self, *, status: int, code: str | None, title: str, detail: str,
                 errors: Mapping[str, Any] | None = None, type: str | None = None,  # noqa: A002 - RFC 9457's name
                 headers: Mapping[str, str] | None = None, body: bytes = b"",
                 idempotency_key: str | None = None, attempts: int = 1) -> None:
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.errors: dict[str, Any] = dict(errors or {})
        self.type = type
        self.headers: dict[str, str] = dict(headers or {})
        self.body = body
        self.idempotency_key = idempotency_key
        self.attempts = attempts
        super().__init__(self._message())

    def _message(self) -> str:
        text = f"{self.status} {self.code or self.title}: {self.detail}"
        if self.errors:
            text += " " + json.dumps(self.errors, sort_keys=True)
        return text

    @property
    def request_id(self) -> str | None:
        """Herald's `X-Request-Id` for the call: quote it when you ask the operator what happened."""
        return _header(self.headers, "x-request-id")

    @property
    def retry_after(self) -> float | None:
        """`Retry-After` in seconds, when Herald sent one (429, 409 in progress)."""
        return parse_retry_after(_header(self.headers, "retry-after"))


# One class per stable code of Herald's API (its docs list them under "Errors").

class ValidationError(APIError):
    """400 `validation_error`: the body, a field or a query parameter is invalid (see `errors`);
    malformed JSON too."""
    code = "validation_error"
    default_status = 400


class IdempotencyKeyMissing(APIError):
    """400 `idempotency_key_missing`: a POST or PATCH without `Idempotency-Key` (this client always sends one)."""
    code = "idempotency_key_missing"
    default_status = 400


class IdempotencyKeyInvalid(APIError):
    """400 `idempotency_key_invalid`: the key is not 8-255 printable ASCII characters."""
    code = "idempotency_key_invalid"
    default_status = 400


class MalformedRequest(APIError):
    """400 `malformed_request`: the HTTP request itself was not valid HTTP/1.1 (its framing), refused by
    Herald's server before any view ran, the connection then closed."""
    code = "malformed_request"
    default_status = 400


class TenantRequired(APIError):
    """400 `tenant_required`: a platform credential called a tenant's path without `/tenants/{tenant}`;
    use `herald.tenant(...)`."""
    code = "tenant_required"
    default_status = 400


class NotAuthenticated(APIError):
    """401 `not_authenticated`: the token is missing, wrong or revoked."""
    code = "not_authenticated"
    default_status = 401


class Forbidden(APIError):
    """403 `forbidden`: the credential may not make this call (a tenant credential calling `/tenants…`)."""
    code = "forbidden"
    default_status = 403


class PermissionDenied(APIError):
    """403 `permission_denied`: an older server's name for `forbidden`."""
    code = "permission_denied"
    default_status = 403


class NotFound(APIError):
    """404 `not_found`: no such object for this credential (another tenant's object is 404 too)."""
    code = "not_found"
    default_status = 404


class MethodNotAllowed(APIError):
    """405 `method_not_allowed`."""
    code = "method_not_allowed"
    default_status = 405


class RequestTimeout(APIError):
    """408 `request_timeout`: the request did not arrive in time (retried by the client)."""
    code = "request_timeout"
    default_status = 408


class Conflict(APIError):
    """409 `conflict`: the object clashes with another (a tenant `uid` that is taken)."""
    code = "conflict"
    default_status = 409


class RecoveryInProgress(Conflict):
    """409 `recovery_in_progress`: a recovery of this endpoint is running; recover again once it completed
    (`recoveries.get(id)`; the `detail` names it). A `Conflict`, so code catching that catches this too."""
    code = "recovery_in_progress"
    default_status = 409


class IdempotencyKeyReused(APIError):
    """409 (or 422) `idempotency_key_reused`: the key was used before with a different request. Use a
    new key for a new operation; never reuse one across different bodies."""
    code = "idempotency_key_reused"
    default_status = 409


class IdempotencyKeyInProgress(APIError):
    """409 `idempotency_key_in_progress`: the first request with this key is still running. The client
    retries it after `Retry-After`; you see this only when the attempts ran out."""
    code = "idempotency_key_in_progress"
    default_status = 409


class PayloadTooLarge(APIError):
    """413 `payload_too_large`: the body is over the deployment's `INTAKE_MAX_BODY_BYTES`."""
    code = "payload_too_large"
    default_status = 413


class UnsupportedMediaType(APIError):
    """415 `unsupported_media_type`."""
    code = "unsupported_media_type"
    default_status = 415


class Throttled(APIError):
    """429 `throttled`: over the credential's rate limit. The client retries after `Retry-After`; you
    see this only when the attempts ran out."""
    code = "throttled"
    default_status = 429


class UriTooLong(APIError):
    """414 `uri_too_long`: the request line (its path and query) is over 4,094 bytes, refused by Herald's server
    before any view ran, the connection then closed."""
    code = "uri_too_long"
    default_status = 414


class RequestHeaderFieldsTooLarge(APIError):
    """431 `request_header_fields_too_large`."""
    code = "request_header_fields_too_large"
    default_status = 431


class ServerError(APIError):
    """A 5xx: `server_error` from Herald (its work was rolled back), or a proxy's 502/503/504. The
    client retries these; you see one only when the attempts ran out."""
    code = "server_error"
    default_status = 500



class DatabaseUnavailable(ServerError):
    """503 `database_unavailable`: Herald's database cannot serve right now (nothing was done). A `ServerError`:
    the client retries it after `Retry-After`; you see this only when the attempts ran out."""
    code = "database_unavailable"
    default_status = 503


class TooManyWaits(Throttled):
    """429 `too_many_waits`: the credential or the poll endpoint already has as many long-polls waiting as it
    may. A `Throttled`: the client retries it after `Retry-After`."""
    code = "too_many_waits"
    default_status = 429

ERRORS_BY_CODE: dict[str, type[APIError]] = {cls.code: cls for cls in (
    ValidationError, IdempotencyKeyMissing, IdempotencyKeyInvalid, MalformedRequest, TenantRequired,
    NotAuthenticated, Forbidden, PermissionDenied, NotFound, MethodNotAllowed, RequestTimeout, Conflict,
    RecoveryInProgress, IdempotencyKeyReused,
    IdempotencyKeyInProgress, PayloadTooLarge, UnsupportedMediaType, Throttled, RequestHeaderFieldsTooLarge,
    UriTooLong, ServerError, DatabaseUnavailable, TooManyWaits) if cls.code}

# An answer without a known code (not problem+json: a proxy's page) still gets the class of its status.
_ERRORS_BY_STATUS: dict[int, type[APIError]] = {401: NotAuthenticated, 403: Forbidden, 404: NotFound,
                                                405: MethodNotAllowed, 408: RequestTimeout, 413: PayloadTooLarge,
                                                414: UriTooLong, 415: UnsupportedMediaType, 429: Throttled,
                                                431: RequestHeaderFieldsTooLarge}


def error_from_response(status: int, reason: str, headers: Mapping[str, str], body: bytes, *,
                        idempotency_key: str | None = None, attempts: int = 1) -> APIError:
    """The exception for an error answer: by its problem `code`, else by its status."""
    problem: dict[str, Any] = {}
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        problem = parsed
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    cls = ERRORS_BY_CODE.get(code or "") or _ERRORS_BY_STATUS.get(status) or (
        ServerError if status >= 500 else APIError)
    errors = problem.get("errors")
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = body[:200].decode("utf-8", "replace").strip() if not problem and body else ""
    return cls(status=status, code=code, title=str(problem.get("title") or reason or status), detail=detail,
               errors=errors if isinstance(errors, dict) else None,
               type=problem.get("type") if isinstance(problem.get("type"), str) else None,
               headers=headers, body=body, idempotency_key=idempotency_key, attempts=attempts)


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None
