"""`POST /api/v1/events` in one statement: the intake's hot path without the generic view machinery.

The idempotency layer (intake/idempotency/middleware.py) hands a request here after its checks (credential,
scope, key, body, fingerprint) and before its own read. What this path takes, and only that: a tenant
credential's `POST /api/v1/events` with no query string, a JSON body that `event_create_input` accepts as it
is (the usual event), the answer negotiated as JSON without asking (no `Accept`, `*/*` or
`application/json`), tracing off. Its key's read, claim, event, deliveries, outbox rows and stored answer
are one call of `herald_event_intake` (webhooks/sql/event_intake.sql), committed by that statement: one
round trip and one commit, where the general path's read, claim, fan-out and store took four, with DRF's
dispatch, Django's transaction and a model instance per row around them (docs/idempotency.md, "The hot
path, measured").

Everything else returns None before any statement, or after one that wrote nothing, and the general path
answers the request as before: a body the serializer must explain, data its type's schema refuses, a key
another request holds, an expired key, a credential revoked since the cache saw it, a race lost on the
key's row. So this path refuses nothing itself: every 4xx is the general path's, with its bytes.
The answer it builds is the one the general path's view builds (tests/test_intake_fast_path.py sends the
same requests through both and compares status, headers, bodies and rows); outside the view, the
middleware around it (request id, security headers, Content-Length, metrics) runs as for any request.
"""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

from django.db import IntegrityError, connection
from django.http import HttpRequest, HttpResponse
from django.urls import get_script_prefix
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from intake import serializers as io
from intake.idempotency import store
from intake.permissions import credential_is_platform
from webhooks import event_schemas, ids, tracing
from webhooks.conf import herald_settings
from webhooks.delivery.publishing import publisher
from webhooks.event_types import matching_patterns
from webhooks.logcontext import request_id
from webhooks.payload import build_payload

logger = logging.getLogger("herald.intake")

PATH = "/api/v1/events"
# The headers EventListCreateView's 202 carries, in its order (Content-Type comes with the response):
# DRF's Allow for the view's methods, then Location. The middleware outside the view adds the rest.
ALLOW = "GET, POST, HEAD, OPTIONS"
_JSON_TYPES = frozenset({"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8"})
_ACCEPTS = frozenset({None, "*/*", "application/json"})
_SQL = "SELECT * FROM herald_event_intake(%s, %s, %s, %s::integer[], %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s, " \
       "%s, %s, %s::jsonb, %s, %s, %s)"
_OUTPUT = io.EventOutput()
_RENDERER = JSONRenderer()
_CUT = b'"deliveries":[]}'


def takes(request: HttpRequest, key: store.Key) -> bool:
    """Whether this request is one this path answers (before anything is read)."""
    meta = request.META
    return (request.path_info == PATH and key.tenant_id is None and herald_settings.api.INTAKE_FAST_PATH
            and not tracing.ENABLED and not meta.get("QUERY_STRING")
            and meta.get("HTTP_ACCEPT") in _ACCEPTS
            and meta.get("CONTENT_TYPE", "").lower() in _JSON_TYPES
            and request.herald_body.is_json and not credential_is_platform(request.herald_credential))


def event_post(request: HttpRequest, key: store.Key) -> HttpResponse | store.Existing | None:
    """The 202 of a first execution, the stored answer under the key (the caller replays it or answers the
    mismatch), or None: the general path answers (nothing was written)."""
    data = io.event_create_input(request.herald_body.value)
    if data is None:
        return None
    event_type = data["type"]
    digest = event_schemas.known_digest(event_type)
    if digest is not None and _refused(event_type, digest, None, data["data"]):
        return None
    credential = request.herald_credential
    created_at = timezone.now()
    event_id = ids.event_id()
    rendered = _RENDERER.render(_OUTPUT.to_representation(SimpleNamespace(
        id=event_id, type=event_type, data=data["data"], channels=data["channels"], created_at=created_at,
        delivery_list=())))
    if not rendered.endswith(_CUT):  # DRF's rendering changed shape: let the view render it
        return None
    location = f"{get_script_prefix()}api/v1/events/{event_id}"
    headers = [["Content-Type", "application/json"], ["Location", location], ["Allow", ALLOW]]
    (key_a, key_b), (own_a, own_b) = key.locks
    params = [credential.id, key.key, key.fingerprint, [key_a, key_b, own_a, own_b], credential.tenant_id,
              event_id, event_type, json.dumps(data["channels"]), json.dumps(matching_patterns(event_type)),
              build_payload(event_type=event_type, created_at=created_at, data=data["data"]), request_id.get(),
              created_at, digest, PATH, json.dumps(headers), rendered[:-2], b"]}",
              herald_settings.api.IDEMPOTENCY_RETENTION_SECONDS]
    for _ in range(2):  # a second turn only after the catalog's schema of this type changed
        try:
            with connection.cursor() as cursor:
                cursor.execute(_SQL, params)
                outcome, fingerprint, status, _, body, encrypted, stored_at, digest, schema, ring = cursor.fetchone()
        except IntegrityError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "23505":  # the key stored by another request since
                return None
            raise
        if outcome == "executed":
            if ring:
                _ring()
            response = HttpResponse(bytes(body), status=202, content_type="application/json")
            response["Location"] = location
            response["Allow"] = ALLOW
            return response
        if outcome == "replay":
            return store.existing_from_row(fingerprint, status, _, body, encrypted, stored_at)
        if outcome != "schema" or _refused(event_type, digest, schema, data["data"]):
            return None
        params[12] = digest
    return None


def _refused(event_type: str, digest: str | None, schema, data) -> bool:
    """Whether the type's schema of `digest` (None: the type has none now) refuses the data: the general path
    then answers its 400 with the errors."""
    if digest is None:
        event_schemas.type_schema_gone(event_type)
        return False
    validator = event_schemas.type_validator(event_type, digest, schema)
    return bool(event_schemas.instance_errors(validator, data, pointer="/data"))


def _ring() -> None:
    """The relays' doorbell after the commit, as the general path's on_commit hook (robust) rings it."""
    try:
        publisher.ring()
    except Exception:
        logger.exception("intake.ring_failed")
