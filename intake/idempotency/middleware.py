"""Applies the idempotency contract to every POST and PATCH under /api/v1/, so no view can forget it.

It sits innermost in MIDDLEWARE and wraps the view call itself: authentication first (the
credential is the scope), then the key and body checks, then one statement to acquire the key,
then the view's work and the key's completion in one transaction.
"""
import hashlib
import logging

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from intake.body import BodyProblem, read_json_body
from intake.credentials import credential_from_authorization
from intake.idempotency import store
from intake.idempotency.fingerprint import request_fingerprint
from intake.idempotency.keys import InvalidIdempotencyKey, parse_idempotency_key
from intake.metrics import intake_requests
from intake.models import IdempotencyKey
from intake.problems import problem_response

logger = logging.getLogger("herald.idempotency")

GUARDED_METHODS = frozenset({"POST", "PATCH"})
GUARDED_PREFIX = "/api/v1/"
MAX_PATH_CHARS = IdempotencyKey._meta.get_field("path").max_length
# Never replayed: hop-by-hop, per-response or secret headers (SPEC §3).
STRIPPED_HEADERS = frozenset({"set-cookie", "authorization", "transfer-encoding", "connection", "date",
                              "content-length"})
RETRY_AFTER_SECONDS = 2


class _Release(Exception):
    """The view answered 5xx: roll its work back and forget the key."""

    def __init__(self, response: HttpResponse):
        self.response = response


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in GUARDED_METHODS or not request.path.startswith(GUARDED_PREFIX):
            return self.get_response(request)
        if len(request.path) > MAX_PATH_CHARS:  # no route has one (ids are short), and no key row holds it
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
        credential, key, body = request.herald_credential, request.herald_key, request.herald_body
        fingerprint = request_fingerprint(
            method=request.method, path=request.path, query_string=request.META.get("QUERY_STRING", ""),
            body=body.raw, parsed_body=body.value, body_is_json=body.is_json,
        )
        outcome = store.key_acquire(
            credential_id=credential.id, key=key, fingerprint=fingerprint, method=request.method,
            path=request.path, retention_seconds=settings.IDEMPOTENCY_RETENTION_SECONDS,
            lock_timeout_seconds=settings.IDEMPOTENCY_LOCK_TIMEOUT_SECONDS,
        )
        if isinstance(outcome, store.Existing):
            return self._answer_existing(request, credential.id, key, fingerprint, outcome)
        return self._execute(request, outcome)

    def _reject(self, request: HttpRequest) -> HttpResponse | None:
        """Checks before any key is taken; a rejection here is never stored."""
        credential = (getattr(request, "herald_credential", None)   # resolved by the rate limit, if on
                      or credential_from_authorization(request.META.get("HTTP_AUTHORIZATION")))
        if credential is None:
            return problem_response(status_code=401, code="not_authenticated",
                                    detail="Send a valid token as `Authorization: Bearer <token>`.",
                                    headers={"WWW-Authenticate": 'Bearer realm="herald"'})
        request.herald_credential = credential

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
        request.herald_key = key
        request.herald_body = body
        return None

    def _execute(self, request: HttpRequest, acquired: store.Acquired) -> tuple[HttpResponse, str]:
        try:
            with transaction.atomic():
                response = self.get_response(request)
                if response.status_code >= 500 or response.streaming:
                    raise _Release(response)
                stored = _stored_response(response)
                # A DRF error answer marks the transaction for rollback: its work is discarded when
                # the block exits, and the key is completed just after, outside it.
                view_rolled_back = transaction.get_rollback()
                if not view_rolled_back:
                    store.key_complete(acquired=acquired, **stored)
            if view_rolled_back:
                store.key_complete(acquired=acquired, **stored)
        except _Release as release:
            _release_quietly(acquired)
            return release.response, "released"
        except store.LockLost:
            logger.warning("idempotency.lock_lost", extra={"method": request.method, "path": request.path})
            return _in_progress(), "in_progress"
        except BaseException:
            _release_quietly(acquired)
            intake_requests.labels("released").inc()
            raise
        return response, "executed"

    def _answer_existing(self, request, credential_id, key, fingerprint,
                         existing: store.Existing) -> tuple[HttpResponse, str]:
        if existing.fingerprint != fingerprint:
            outcome, response = "mismatch", problem_response(
                status_code=settings.IDEMPOTENCY_MISMATCH_STATUS, code="idempotency_key_reused",
                detail="This Idempotency-Key was used with a different request (method, path, query or body).")
        elif existing.status != "completed":
            outcome, response = "in_progress", _in_progress()
        else:
            outcome, response = "replayed", _replay(existing)
        logger.info(f"idempotency.{outcome}", extra={
            "outcome": outcome,
            "credential": credential_id,
            "method": request.method,
            "path": request.path,
            "key_sha256": hashlib.sha256(key.encode()).hexdigest()[:16],
            "original_status": existing.response_status,
            "age_seconds": round((timezone.now() - existing.created_at).total_seconds(), 3),
        })
        return response, outcome


def _release_quietly(acquired: store.Acquired) -> None:
    try:
        store.key_release(acquired=acquired)
    except Exception:  # the database may be what failed; the key then expires by the lock timeout
        logger.exception("idempotency.release_failed", extra={"key_id": acquired.id})


def _stored_response(response: HttpResponse) -> dict:
    headers = [[name, value] for name, value in response.items() if name.lower() not in STRIPPED_HEADERS]
    return {"status": response.status_code, "headers": headers, "body": bytes(response.content)}


def _replay(existing: store.Existing) -> HttpResponse:
    response = HttpResponse(existing.response_body or b"", status=existing.response_status)
    del response["Content-Type"]
    for name, value in existing.response_headers or []:
        response[name] = value
    response["Idempotent-Replay"] = "true"
    return response


def _in_progress() -> HttpResponse:
    return problem_response(
        status_code=409, code="idempotency_key_in_progress",
        detail="A request with this Idempotency-Key is still being processed; retry later with the same key.",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
