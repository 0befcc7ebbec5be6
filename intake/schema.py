"""OpenAPI for the REST API: every POST/PATCH documents Idempotency-Key and every problem it can get."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema

from intake.idempotency.keys import MAX_LENGTH, MIN_LENGTH
from intake.idempotency.middleware import RETRY_AFTER_SECONDS
from webhooks.conf import herald_settings

PROBLEM_SCHEMA = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "errors": {"type": "object", "additionalProperties": True,
                   "description": "Field name → messages, for `validation_error`."},
    },
}

IDEMPOTENCY_DESCRIPTION = f"""
Required on every POST and PATCH. {MIN_LENGTH}–{MAX_LENGTH} printable ASCII characters (a quoted
RFC 8941 string is accepted and unquoted); a UUID is a good choice. Scoped to your API credential.

* The first request executes; its status, headers and body are stored with the key in the same
  database transaction as its work, and kept for **24 hours** (`IDEMPOTENCY_RETENTION_SECONDS`).
* A retry with the same key and the same request (method, path, sorted query, canonical JSON body)
  gets the stored answer byte for byte, with `Idempotent-Replay: true`; nothing runs again.
* The same key with a different request: `idempotency_key_reused`.
* While the first request is still running: 409 `idempotency_key_in_progress` with
  `Retry-After: {RETRY_AFTER_SECONDS}`; retry later with the same key.
* 2xx and 4xx answers of the operation are stored; a 5xx rolls the work back and forgets the key.
  Requests rejected before the operation runs (401, key errors, 413, 415, 429, malformed JSON) are
  never stored: fix them (or wait) and retry with the same key.
"""

_WRITE_PROBLEMS = {
    "400": "`validation_error`, `idempotency_key_missing` or `idempotency_key_invalid`",
    "401": "`not_authenticated`: missing or wrong bearer token",
    "409": "`idempotency_key_in_progress` (retry after `Retry-After` seconds with the same key) or "
           "`idempotency_key_reused`",
    "413": "`payload_too_large`: body over `INTAKE_MAX_BODY_BYTES`",
    "415": "`unsupported_media_type`: send `Content-Type: application/json`",
}
_READ_PROBLEMS = {
    "400": "`validation_error` (bad filter or pagination parameter)",
    "401": "`not_authenticated`: missing or wrong bearer token",
}
_THROTTLED = ("`throttled`: this credential is over `INTAKE_RATE_LIMIT_PER_SECOND` (when the operator set one); "
              "retry after `Retry-After` seconds")


def _problem(description: str) -> dict:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


ACTING_PREFIX = "/api/v1/tenants/{tenant}/"
_TENANT_PARAMETER = "The tenant: its id (`tnt_…`) or your `uid` for it."


class HeraldAutoSchema(AutoSchema):
    """The tenant calls appear twice (SPEC §10): at /api/v1/… for a tenant credential and under
    /api/v1/tenants/{tenant}/… for a platform credential; the second family's operation ids start with
    `tenant_`, and each family documents the refusal the other kind of credential gets."""

    def _acting(self) -> bool:
        return getattr(self.view, "acts_for_tenant", False) and self.path.startswith(ACTING_PREFIX)

    def get_tags(self):
        if self._acting():
            return ["platform: acting for a tenant"]
        if self.path.startswith("/api/v1/tenants"):
            return ["platform: tenants"]
        return super().get_tags()

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        if self._acting():  # (the views' extend_schema sets the id: renamed here, after it)
            operation["operationId"] = "tenant_" + operation["operationId"]
        responses = operation.setdefault("responses", {})
        writes = method in ("POST", "PATCH")
        problems = dict(_WRITE_PROBLEMS if writes else _READ_PROBLEMS)
        problems["429"] = _THROTTLED + (", with the same key" if writes else "")
        # answered by the web server before any view: a request line over 4,094 bytes (a long query, a long id)
        problems["414"] = "`uri_too_long`: the request line is over 4,094 bytes"
        if "{" in path:
            problems["404"] = "`not_found`: no such object for this tenant"
        if path.startswith("/api/v1/tenants"):
            problems["403"] = "`forbidden`: a tenant credential; these calls take a platform credential"
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") == "tenant":
                    parameter["description"] = _TENANT_PARAMETER
        else:
            problems["400"] += "; `tenant_required`: a platform credential (use /api/v1/tenants/{tenant}/…)"
        if path.startswith("/api/v1/tenants") and method == "POST" and path.endswith("/tenants"):
            problems["409"] += "; `conflict`: a tenant with this `uid` exists"
        for status, description in getattr(self.view, "problems", {}).items():  # the view's own (403, 409)
            if status in problems and status == "409":
                description = problems[status] + "; or " + description
            problems[status] = description
        if writes and herald_settings.api.IDEMPOTENCY_MISMATCH_STATUS != 409:
            problems[str(herald_settings.api.IDEMPOTENCY_MISMATCH_STATUS)] = "`idempotency_key_reused`"
        for status, description in problems.items():
            responses.setdefault(status, _problem(description))
        if writes:
            operation.setdefault("parameters", []).append({
                "in": "header", "name": "Idempotency-Key", "required": True,
                "description": IDEMPOTENCY_DESCRIPTION,
                "schema": {"type": "string", "minLength": MIN_LENGTH, "maxLength": MAX_LENGTH,
                           "pattern": "^[\\x20-\\x7E]+$"},
            })
        return operation


def add_problem_component(result, generator, request, public):
    """Postprocessing hook: the shared problem+json schema."""
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    return result


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "intake.authentication.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "`python manage.py create_credential`"}
