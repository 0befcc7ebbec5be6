"""Checks of a write request's body before any view runs: size (413), media type (415), JSON (400)."""
import json
import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from webhooks.conf import herald_settings


@dataclass(frozen=True)
class BodyProblem(Exception):
    status_code: int
    code: str
    detail: str


@dataclass(frozen=True)
class JsonBody:
    raw: bytes
    value: Any  # None when the body is empty
    is_json: bool


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# JSON may escape U+0000 and lone surrogates; PostgreSQL's jsonb and UTF-8 cannot hold them.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _walk_fails(value: Any) -> bool:
    try:
        return _has_unstorable(value)
    except RecursionError:
        return True


def _has_unstorable(value: Any) -> bool:
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_unstorable(k) or _has_unstorable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_unstorable(item) for item in value)
    return False


def read_json_body(request: HttpRequest) -> JsonBody:
    """Return the body parsed as JSON, or raise BodyProblem; an empty body is allowed (action POSTs)."""
    limit = herald_settings.api.INTAKE_MAX_BODY_BYTES
    too_large = BodyProblem(413, "payload_too_large", f"The request body exceeds {limit} bytes.")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise BodyProblem(400, "validation_error", "The Content-Length header is not a number.") from None
    if declared > limit:
        raise too_large
    try:
        raw = request.body
    except RequestDataTooBig:
        raise too_large from None
    if len(raw) > limit:
        raise too_large
    if not raw:
        return JsonBody(raw=b"", value=None, is_json=False)
    media_type = request.content_type.lower()
    if media_type != "application/json":  # exactly what the API's parser takes, so no view refuses it later
        raise BodyProblem(415, "unsupported_media_type",
                          f"Send JSON with Content-Type: application/json, not {media_type or 'nothing'}.")
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BodyProblem(400, "validation_error", f"The request body is not valid JSON: {exc}.") from None
    # Only an escape (\u0000, \ud800) can smuggle these in, so most bodies skip the walk.
    if b"\\u" in raw and _walk_fails(value):  # JSON has no other way to write them
        raise BodyProblem(400, "validation_error",
                          "JSON strings may not contain U+0000 or unpaired surrogates (\\u0000, \\ud800).")
    return JsonBody(raw=raw, value=value, is_json=True)
