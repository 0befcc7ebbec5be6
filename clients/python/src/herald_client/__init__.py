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
from herald_client.errors import (ERRORS_BY_CODE, APIError, Conflict, Forbidden, HeraldConnectionError, HeraldError,
                                  IdempotencyKeyInProgress, IdempotencyKeyInvalid, IdempotencyKeyMissing,
                                  IdempotencyKeyReused, MethodNotAllowed, NotAuthenticated, NotFound,
                                  PayloadTooLarge, PermissionDenied, RequestHeaderFieldsTooLarge, RequestTimeout,
                                  ServerError, TenantRequired, Throttled, UnsupportedMediaType, ValidationError,
                                  WebhookVerificationError)
from herald_client.pagination import ListIterator, Page
from herald_client.webhooks import WebhookVerifier, verify

__all__ = [
    "APIError", "Conflict", "ERRORS_BY_CODE", "Forbidden", "Herald", "HeraldConnectionError", "HeraldError",
    "IdempotencyKeyInProgress", "IdempotencyKeyInvalid", "IdempotencyKeyMissing", "IdempotencyKeyReused",
    "ListIterator", "MethodNotAllowed", "NO_RETRIES", "NotAuthenticated", "NotFound", "OMIT", "Page",
    "PayloadTooLarge", "PermissionDenied", "RequestHeaderFieldsTooLarge", "RequestTimeout", "Response",
    "RetryInfo", "RetryPolicy", "ServerError", "TenantRequired", "TenantScope", "Throttled", "UnsupportedMediaType",
    "ValidationError", "WebhookVerificationError", "WebhookVerifier", "__version__", "verify",
]
