"""The deployment's event-type catalog (SPEC §12): create, change and delete entries, each checked whole.

Used by the API (platform credential) and the admin alike, so both refuse the same things: a name that is
not an event type or is Herald's own (`herald.…`), a schema that is not draft 2020-12, an example that does
not match the schema.
"""
from typing import Any

from django.db import IntegrityError, transaction

from webhooks import event_schemas, event_types
from webhooks.models import EventType

_UNSET = object()


class EventTypeInvalid(Exception):
    """The entry does not hold together; `errors` maps a field or a JSON pointer (`/schema/type`,
    `/example/amount`) to messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


class EventTypeExists(Exception):
    """Another entry has this name."""


def event_type_name_errors(name: str) -> list[str]:
    """Why `name` cannot name a catalog entry ([] when it can)."""
    if not event_types.is_valid_type(name):
        return ["Use dot-separated segments of [A-Za-z0-9_], e.g. invoice.paid."]
    if event_types.is_reserved(name):
        return [f"Types starting with '{event_types.RESERVED_PREFIX}' are Herald's own operational events."]
    return []


def event_type_check(*, schema: Any, example: Any) -> str | None:
    """Check a schema and an example together; return the schema's digest (None without a schema).

    Raises EventTypeInvalid with pointers into the request body (`/schema/…`, `/example/…`)."""
    if schema is None:
        return None
    try:
        validator = event_schemas.schema_check(schema, pointer="/schema")
    except event_schemas.SchemaInvalid as exc:
        raise EventTypeInvalid(exc.errors) from None
    if example is not None:
        errors = event_schemas.instance_errors(validator, example, pointer="/example")
        if errors:
            raise EventTypeInvalid(errors)
    return event_schemas.schema_digest(schema)


def event_type_create(*, name: str, description: str = "", schema: Any = None, example: Any = None) -> EventType:
    """Add an entry; EventTypeExists when the name is taken (also when a concurrent create won)."""
    name_errors = event_type_name_errors(name)
    if name_errors:
        raise EventTypeInvalid({"name": name_errors})
    digest = event_type_check(schema=schema, example=example)
    try:
        with transaction.atomic():
            return EventType.objects.create(name=name, description=description, schema=schema,
                                            schema_digest=digest, example=example)
    except IntegrityError:
        raise EventTypeExists(name) from None


def event_type_update(*, event_type: EventType, description: Any = _UNSET, schema: Any = _UNSET,
                      example: Any = _UNSET) -> EventType:
    """Change what is given (`schema=None` removes the schema); the result is checked whole, so a new
    schema the kept example does not match is refused. Intake uses the new schema from its next event."""
    if description is not _UNSET:
        event_type.description = description
    if schema is not _UNSET:
        event_type.schema = schema
    if example is not _UNSET:
        event_type.example = example
    event_type.schema_digest = event_type_check(schema=event_type.schema, example=event_type.example)
    event_type.save()
    return event_type


def event_type_delete(*, event_type: EventType) -> None:
    """Remove the entry: events of that type are accepted unchecked from then on; endpoints subscribed to
    it keep their subscription."""
    event_type.delete()
