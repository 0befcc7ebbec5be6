"""herald-client: a typed Python client for Herald, the self-hosted webhook dispatcher.

    from herald_client import Herald, verify

    herald = Herald("http://127.0.0.1:8000", token="hrld_…")
    event = herald.events.create("invoice.paid", {"invoice": "in_1"})

See the package's README for the whole API: every call, retries and idempotency keys, errors,
pagination, acting for tenants with a platform credential, and `verify()` for receivers.
"""
from herald_client._http import NO_RETRIES, Response, RetryInfo, RetryPolicy
from herald_client._version import __version__
from herald_client.client import OMIT, Herald, TenantScope
from herald_client.errors import (ERRORS_BY_CODE, APIError, Conflict, DatabaseUnavailable, Forbidden,
                                  HeraldConnectionError, HeraldError, IdempotencyKeyInProgress, IdempotencyKeyInvalid, IdempotencyKeyMissing,
                                  IdempotencyKeyReused, MalformedRequest, MethodNotAllowed, NotAuthenticated,
                                  NotFound, PayloadTooLarge, PermissionDenied, RecoveryInProgress,
                                  RequestHeaderFieldsTooLarge, RequestTimeout, ServerError, TenantRequired, Throttled,
                                  TooManyWaits, UnsupportedMediaType, UriTooLong, ValidationError,
                                  WebhookVerificationError)
from herald_client.pagination import ListIterator, Page
from herald_client.webhooks import WebhookVerifier, verify

__all__ = [
    "APIError", "Conflict", "DatabaseUnavailable", "ERRORS_BY_CODE", "Forbidden", "Herald", "HeraldConnectionError", "HeraldError",
    "IdempotencyKeyInProgress", "IdempotencyKeyInvalid", "IdempotencyKeyMissing", "IdempotencyKeyReused",
    "ListIterator", "MalformedRequest", "MethodNotAllowed", "NO_RETRIES", "NotAuthenticated", "NotFound", "OMIT",
    "Page", "PayloadTooLarge", "PermissionDenied", "RecoveryInProgress", "RequestHeaderFieldsTooLarge",
    "RequestTimeout", "Response",
    "RetryInfo", "RetryPolicy", "ServerError", "TenantRequired", "TenantScope", "Throttled", "TooManyWaits", "UnsupportedMediaType", "UriTooLong",
    "ValidationError", "WebhookVerificationError", "WebhookVerifier", "__version__", "verify",
]
