"""Event type names and subscription patterns: `invoice.paid`, `invoice.*`, `*`; `herald.…` is Herald's own."""
import re

TYPE_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
PATTERN_RE = re.compile(r"^(\*|[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*(\.\*)?)$")

# Operational events (SPEC §8): Herald tells a tenant about its own endpoints with these types.
RESERVED_PREFIX = "herald."
ENDPOINT_TRIPPED = "herald.endpoint.tripped"
ENDPOINT_RECOVERED = "herald.endpoint.recovered"
ENDPOINT_DISABLED = "herald.endpoint.disabled"
DELIVERY_FAILED = "herald.delivery.failed"
TEST = "herald.test"  # sent to one endpoint on request (POST /endpoints/{id}/test, the portal)


def is_valid_type(value: str) -> bool:
    return bool(TYPE_RE.match(value))


def is_valid_pattern(value: str) -> bool:
    return bool(PATTERN_RE.match(value))


def is_reserved(event_type: str) -> bool:
    """True for Herald's operational types, which clients may subscribe to but never post."""
    return event_type.startswith(RESERVED_PREFIX)


def matching_patterns(event_type: str) -> list[str]:
    """Every subscription pattern that matches `event_type`, so fan-out is one array-overlap query.

    `a.b.c` is matched by `a.b.c`, `a.b.*`, `a.*` and `*`. An operational type is matched only by
    patterns that name it (`herald.endpoint.tripped`, `herald.endpoint.*`, `herald.*`), never by `*`.
    """
    segments = event_type.split(".")
    patterns = [event_type] if is_reserved(event_type) else [event_type, "*"]
    patterns.extend(".".join(segments[:n]) + ".*" for n in range(1, len(segments)))
    return patterns
