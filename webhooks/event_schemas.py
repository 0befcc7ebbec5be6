"""JSON Schemas (draft 2020-12) of the event-type catalog: checked on write, compiled once per process.

Intake's ingest statement also reads the catalog entry of the event's type (its `schema_digest`, and its
`schema` only when this process does not hold a validator of that digest), so the check costs no extra
round trip and a changed schema reaches every process at its next event of that type.
"""
import hashlib
import json
from itertools import islice
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from webhooks import linear_regex

DIALECT = "https://json-schema.org/draft/2020-12/schema"
MAX_ERRORS = 20        # a list of 10,000 bad items answers with the first few, not a 10,000-line body
MAX_MESSAGE_CHARS = 300  # jsonschema's messages quote the instance, which can be the whole body
MAX_CACHED = 1000      # validators held per process (one per schema'd type in use)
# A schema is bounded when written: its canonical JSON (schema_digest's) at most MAX_SCHEMA_BYTES, its
# objects and arrays nested at most MAX_SCHEMA_DEPTH deep. With the body's bound (INTAKE_MAX_BODY_BYTES)
# and RE2's linear time, this bounds what checking one event can cost.
MAX_SCHEMA_BYTES = 65536
MAX_SCHEMA_DEPTH = 32

# The meta-schemas and nothing else: without a registry of its own, jsonschema fetches an unknown `$ref`
# URL with urllib (deprecated, but still so in 4.x), which would let a schema make Herald call any
# address. An empty Registry has no `retrieve`: such a `$ref` is Unresolvable instead.
_NO_RETRIEVAL = Registry()


# Draft 2020-12, with every regular expression matched by RE2 in linear time (webhooks/linear_regex.py).
LinearValidator = validators.extend(Draft202012Validator, linear_regex.KEYWORDS,
                                    format_checker=linear_regex.FORMAT_CHECKER)


def compile_schema(schema: dict) -> Draft202012Validator:
    """A validator of a checked schema that never fetches anything and never backtracks."""
    return LinearValidator(schema, registry=_NO_RETRIEVAL)


class SchemaInvalid(Exception):
    """The schema is not a valid draft 2020-12 schema; `errors` maps a JSON pointer to messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


def schema_digest(schema: Any) -> str:
    """SHA-256 of the schema's canonical JSON: the identity of a compiled validator across processes."""
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def schema_check(schema: Any, *, pointer: str = "/schema") -> Draft202012Validator:
    """Return a validator of `schema`, or raise SchemaInvalid: not an object, over the size or depth bound,
    another dialect, not valid against the draft 2020-12 meta-schema (a `pattern` RE2 will not take too,
    keyed by its pointer), or a `$ref` that does not resolve within the schema (Herald never fetches a
    schema from the network)."""
    if not isinstance(schema, dict):
        raise SchemaInvalid({pointer: ["A JSON Schema must be an object."]})
    too_deep = _deeper_than(schema, MAX_SCHEMA_DEPTH, ())
    if too_deep is not None:
        raise SchemaInvalid({pointer + _pointer(too_deep): [
            f"The schema is nested too deeply (at most {MAX_SCHEMA_DEPTH} levels of objects and arrays)."]})
    size = len(json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise SchemaInvalid({pointer: [f"The schema is {size} bytes as JSON; at most {MAX_SCHEMA_BYTES} are allowed."]})
    dialect = schema.get("$schema", DIALECT)
    if dialect not in (DIALECT, DIALECT + "#"):
        raise SchemaInvalid({pointer + "/$schema": [f"Only JSON Schema draft 2020-12 ({DIALECT}) is supported."]})
    try:
        Draft202012Validator.check_schema(schema, format_checker=linear_regex.FORMAT_CHECKER)
    except SchemaError as exc:
        # a pattern RE2 refuses: its own reason, rather than "… is not a 'regex'"
        message = str(exc.cause) if isinstance(exc.cause, linear_regex.PatternRefused) else exc.message
        raise SchemaInvalid({pointer + _pointer(exc.absolute_path): [_short(message)]}) from None
    except RecursionError:
        raise SchemaInvalid({pointer: ["The schema is nested too deeply."]}) from None
    validator = compile_schema(schema)
    resolver = SPECIFICATIONS.combine(_NO_RETRIEVAL).resolver_with_root(DRAFT202012.create_resource(schema))
    problems = {}
    for path, ref in _refs(schema, ()):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            problems[pointer + _pointer(path)] = [f"$ref {ref!r} does not resolve within this schema."]
        if len(problems) >= MAX_ERRORS:
            break
    if problems:
        raise SchemaInvalid(problems)
    return validator


def _deeper_than(node: Any, limit: int, path: tuple) -> tuple | None:
    """The path of the first object or array nested more than `limit` deep in `node`, or None."""
    if not isinstance(node, (dict, list)):
        return None
    if limit <= 0:
        return path
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        found = _deeper_than(value, limit - 1, path + (key,))
        if found is not None:
            return found
    return None


def _refs(node: Any, path: tuple, depth: int = 0):
    """Every `$ref` in the schema with its path (subschemas with an `$id` of their own are left to
    validation time: their base URI differs)."""
    if depth > 200:
        return
    if isinstance(node, dict):
        if depth and "$id" in node:
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield path + ("$ref",), ref
        for key, value in node.items():
            if key not in ("const", "enum", "default", "examples"):
                yield from _refs(value, path + (key,), depth + 1)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _refs(value, path + (index,), depth + 1)


def instance_errors(validator: Draft202012Validator, instance: Any, *, pointer: str) -> dict[str, list[str]]:
    """The instance's errors keyed by JSON pointer below `pointer` (e.g. `/data/amount`); {} when it matches.
    A missing required property is keyed by where it should be (`/data/amount`), as a form would show it."""
    errors: dict[str, list[str]] = {}
    try:
        for error in islice(validator.iter_errors(instance), MAX_ERRORS):
            at = pointer + _pointer(error.absolute_path)
            if error.validator == "required" and isinstance(error.instance, dict):
                missing = [name for name in error.validator_value if name not in error.instance]
                for name in missing:
                    errors.setdefault(at + "/" + _escape(str(name)), ["This property is required."])
                continue
            errors.setdefault(at, []).append(_short(error.message))
    except RecursionError:
        return {pointer: ["Too deeply nested to validate."]}
    except linear_regex.PatternRefused as exc:  # a schema stored before patterns were checked by RE2
        return {pointer: [_short(f"The event type's schema has a pattern that cannot be checked: {exc}")]}
    except Unresolvable as exc:  # a $ref inside a subschema with its own $id (checked at write where possible)
        return {pointer: [_short(f"The event type's schema has a $ref that does not resolve: {exc}")]}
    return errors


# Validators compiled in this process, by schema digest, and the digest last seen for each type. Keyed by
# digest, a validator is never replaced under a thread that still needs it (gunicorn runs threads).
_validators: dict[str, Draft202012Validator] = {}
_digest_of: dict[str, str] = {}


def known_digest(event_type: str) -> str | None:
    """The digest of the schema this process holds a validator for (the ingest statement returns the
    schema itself only when the catalog's differs)."""
    digest = _digest_of.get(event_type)
    return digest if digest in _validators else None


def type_validator(event_type: str, digest: str, schema: Any | None) -> Draft202012Validator:
    """The validator of the catalog's current schema for `event_type`: the one held for `digest`, else
    compiled from `schema` (which the ingest statement sends exactly then) and held."""
    validator = _validators.get(digest)
    if validator is None:
        if schema is None:  # held when the statement ran, forgotten since (the cache was full): read it again
            from webhooks.models import EventType

            schema = EventType.objects.filter(name=event_type).values_list("schema", flat=True).first() or {}
            digest = schema_digest(schema)
        if isinstance(schema, str):  # jsonb from a raw cursor: Django has psycopg hand it over as text
            schema = json.loads(schema)
        validator = compile_schema(schema)
        if len(_validators) >= MAX_CACHED:
            _validators.clear()
            _digest_of.clear()
        _validators[digest] = validator
    _digest_of[event_type] = digest
    return validator


def type_schema_gone(event_type: str) -> None:
    """The catalog has no schema for `event_type` now: forget the digest this process last saw for it."""
    _digest_of.pop(event_type, None)


def cache_clear() -> None:
    """Forget every compiled validator of this process (tests)."""
    _validators.clear()
    _digest_of.clear()


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pointer(path) -> str:
    return "".join("/" + _escape(str(token)) for token in path)


def _short(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"
