"""Applies the idempotency contract to every POST and PATCH under /api/v1/, so no view can forget it.

It sits innermost in MIDDLEWARE and wraps the view call itself: authentication first (the
credential is the scope), the scope rule by the routed path (`path_info`), then the key and body
checks (and the tenant a platform acts for, which scopes its key too), then one read of the key (a replay ends
there), then one transaction that claims the key (an advisory lock), runs the view and stores its
answer with the work: one commit per first execution (intake/idempotency/store.py). POST /api/v1/events's
usual request goes instead, after the same checks, to its fast path (intake/idempotency/fast_events.py): the read, the
claim, the work and the store in one statement; whatever that path does not take it hands back untouched.
"""
import hashlib
import logging

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from intake.idempotency import fast_events
from intake.body import BodyProblem, read_json_body
from intake.credentials import credential_from_authorization
from intake.idempotency import store
from intake.idempotency.fingerprint import request_fingerprint
from intake.idempotency.keys import InvalidIdempotencyKey, parse_idempotency_key
from intake.metrics import intake_requests
from intake.models import IdempotencyKey
from intake.permissions import credential_is_platform, is_platform_path, request_route, scope_refusal
from intake.problems import NotFound, problem_response
from intake.tenants import tenant_get
from webhooks import tracing
from webhooks.conf import herald_settings

logger = logging.getLogger("herald.idempotency")

GUARDED_METHODS = frozenset({"POST", "PATCH"})
GUARDED_PREFIX = "/api/v1/"
MAX_PATH_CHARS = IdempotencyKey._meta.get_field("path").max_length
# Never replayed: hop-by-hop, per-response or secret headers (SPEC §3).
STRIPPED_HEADERS = frozenset({"set-cookie", "authorization", "transfer-encoding", "connection", "date",
                              "content-length"})
RETRY_AFTER_SECONDS = 2


class _Release(Exception):
    """The view answered 5xx: roll its work back; the key stays free."""

    def __init__(self, response: HttpResponse):
        self.response = response


def guarded(request: HttpRequest) -> bool:
    """Whether the idempotency contract applies to this request (and so its credential may be cached).
    By `path_info`, the path the request is routed by: `request.path` carries the WSGI mount point too."""
    return request.method in GUARDED_METHODS and request.path_info.startswith(GUARDED_PREFIX)


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not guarded(request):
            return self.get_response(request)
        if len(request.path_info) > MAX_PATH_CHARS:  # no route has one (ids are short), and no key row holds it
            return problem_response(status_code=404, code="not_found", detail="No route for a path this long.")
        return self._guarded(request)

    def _guarded(self, request: HttpRequest) -> HttpResponse:
        response, outcome = self._answer(request)
        intake_requests.labels(outcome).inc()
        return response

    def _answer(self, request: HttpRequest) -> tuple[HttpResponse, str]:
        rejected = self._reject(request)
        if rejected is not None:
            return rejected, "rejected"
        body = request.herald_body
        key = store.Key(credential_id=request.herald_credential.id, key=request.herald_key,
                        tenant_id=request.herald_key_tenant,
                        fingerprint=request_fingerprint(
                            method=request.method, path=request.path_info,
                            query_string=request.META.get("QUERY_STRING", ""), body=body.raw,
                            parsed_body=body.value, body_is_json=body.is_json))
        if fast_events.takes(request, key):  # POST /api/v1/events's usual request: one statement, or None
            try:
                fast = fast_events.event_post(request, key)
            except BaseException:  # its statement rolled back whole: nothing is stored, the key is free
                intake_requests.labels("released").inc()
                raise
            if isinstance(fast, store.Existing):
                return self._answer_existing(request, key, fast)
            if fast is not None:
                return fast, "executed"
        # Each turn reads what committed before it; another turn follows only a race lost to a request
        # with the same key that finished (answered from its row) or died (this one executes).
        for _ in range(3):
            existing = store.key_read(key)
            if existing is not None and not existing.expired:
                return self._answer_existing(request, key, existing)
            try:
                return self._execute(request, key, replace_expired=existing is not None)
            except store.KeyBusy:
                held = store.key_busy(key)
                if isinstance(held, store.Existing):
                    return self._answer_existing(request, key, held)
                if held is not None:
                    return self._answer_busy(request, key, held)
            except store.KeyTaken:
                pass
            except store.CredentialRevoked:
                return _not_authenticated(), "rejected"
        return self._answer_busy(request, key, store.Busy(same_request=True))

    def _reject(self, request: HttpRequest) -> HttpResponse | None:
        """Checks before any key is taken; a rejection here is never stored."""
        # From the cache if seen lately: the key's read and claim check that it is still live.
        credential = (getattr(request, "herald_credential", None)   # resolved by the rate limit, if on
                      or credential_from_authorization(request.META.get("HTTP_AUTHORIZATION"), cached=True))
        if credential is None:
            return _not_authenticated()
        request.herald_credential = credential
        # By path_info, what Django routes (never request.path, which the mount point prefixes): the same
        # answer as the resolved route's (routes are literal prefixes), without resolving on the hot path.
        refusal = scope_refusal(credential, request.path_info)
        if refusal is not None:  # the wrong kind of credential for the route (SPEC §10)
            return problem_response(status_code=refusal.status_code, code=refusal.default_code,
                                    detail=str(refusal.detail))

        raw_key = request.META.get("HTTP_IDEMPOTENCY_KEY")
        if raw_key is None:
            return problem_response(status_code=400, code="idempotency_key_missing",
                                    detail="Every POST and PATCH needs an Idempotency-Key header.")
        try:
            key = parse_idempotency_key(raw_key)
        except InvalidIdempotencyKey as exc:
            return problem_response(status_code=400, code="idempotency_key_invalid",
                                    detail=f"The Idempotency-Key {exc}.")
        try:
            body = read_json_body(request)
        except BodyProblem as problem:
            return problem_response(status_code=problem.status_code, code=problem.code, detail=problem.detail)
        # The platform acting for a tenant: its keys there are that tenant's (SPEC §10), by the tenant's id
        # whether the path named it by id or uid, so that erasing the tenant erases them and a later tenant
        # given the same uid never meets one. A tenant the path names that does not exist is 404 here,
        # before any key is taken (never stored: the tenant may be created next, and the retry executes).
        request.herald_key_tenant = None
        ref = (request_route(request)[1].get("tenant")
               if credential_is_platform(credential) and is_platform_path(request.path_info) else None)
        if ref is not None:
            tenant = tenant_get(ref=ref)
            if tenant is None:
                return problem_response(status_code=404, code="not_found", detail=NotFound.default_detail)
            request.herald_tenant = tenant
            request.herald_key_tenant = tenant.pk
        request.herald_key = key
        request.herald_body = body
        return None

    def _execute(self, request: HttpRequest, key: store.Key, replace_expired: bool) -> tuple[HttpResponse, str]:
        """Claim the key, run the view and store its answer, in one transaction with one commit."""
        rolled_back = None
        try:
            with tracing.span("herald.intake.transaction"), store.key_transaction():
                finished = store.key_claim(key)
                if finished is not None:  # the request holding the key committed while this one waited
                    return self._answer_existing(request, key, finished)
                response = self.get_response(request)
                if response.status_code >= 500 or response.streaming:
                    raise _Release(response)
                stored = {"method": request.method, "path": request.path_info, "replace_expired": replace_expired,
                          "retention_seconds": herald_settings.api.IDEMPOTENCY_RETENTION_SECONDS,
                          **_stored_response(response)}
                if response.status_code >= 400 or transaction.get_rollback():
                    # A 4xx is stored, its work is not: roll back, then store the answer alone below.
                    transaction.set_rollback(True)
                    rolled_back = stored
                else:
                    store.key_store(key, commit=True, **stored)  # the last statement, with the COMMIT
            if rolled_back is not None:
                store.key_store(key, commit=False, **{**rolled_back, "replace_expired": True})
        except _Release as release:
            return release.response, "released"
        except (store.KeyBusy, store.KeyTaken, store.CredentialRevoked):
            raise
        except BaseException:
            intake_requests.labels("released").inc()
            raise
        return response, "executed"

    def _answer_existing(self, request: HttpRequest, key: store.Key,
                         existing: store.Existing) -> tuple[HttpResponse, str]:
        if existing.fingerprint != key.fingerprint:
            outcome, response = "mismatch", _mismatch()
        else:
            outcome, response = "replayed", _replay(existing)
        _log(outcome, request, key, original_status=existing.response_status, created_at=existing.created_at)
        return response, outcome

    def _answer_busy(self, request: HttpRequest, key: store.Key, busy: store.Busy) -> tuple[HttpResponse, str]:
        outcome, response = ("in_progress", _in_progress()) if busy.same_request else ("mismatch", _mismatch())
        _log(outcome, request, key, original_status=None, created_at=None)
        return response, outcome


def _log(outcome: str, request: HttpRequest, key: store.Key, *, original_status: int | None,
         created_at) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(f"idempotency.{outcome}", extra={
        "outcome": outcome,
        "credential": key.credential_id,
        "method": request.method,
        "path": request.path_info,
        "tenant": key.tenant_id,
        "key_sha256": hashlib.sha256(key.key.encode()).hexdigest()[:16],
        "original_status": original_status,
        "age_seconds": None if created_at is None else round((timezone.now() - created_at).total_seconds(), 3),
    })


def _stored_response(response: HttpResponse) -> dict:
    """What is stored of an answer; encrypted at rest when its view marked it `carries_secret`."""
    headers = [[name, value] for name, value in response.items() if name.lower() not in STRIPPED_HEADERS]
    return {"status": response.status_code, "headers": headers, "body": bytes(response.content),
            "encrypt": bool(getattr(response, "carries_secret", False))}


def _replay(existing: store.Existing) -> HttpResponse:
    response = HttpResponse(existing.response_body or b"", status=existing.response_status)
    del response["Content-Type"]
    for name, value in existing.response_headers or []:
        response[name] = value
    response["Idempotent-Replay"] = "true"
    return response


def _not_authenticated() -> HttpResponse:
    return problem_response(status_code=401, code="not_authenticated",
                            detail="Send a valid token as `Authorization: Bearer <token>`.",
                            headers={"WWW-Authenticate": 'Bearer realm="herald"'})


def _mismatch() -> HttpResponse:
    return problem_response(
        status_code=herald_settings.api.IDEMPOTENCY_MISMATCH_STATUS, code="idempotency_key_reused",
        detail="This Idempotency-Key was used with a different request (method, path, query or body).")


def _in_progress() -> HttpResponse:
    return problem_response(
        status_code=409, code="idempotency_key_in_progress",
        detail="A request with this Idempotency-Key is still being processed; retry later with the same key.",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
