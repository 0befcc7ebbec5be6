"""Event type names and subscription patterns: `invoice.paid`, `invoice.*`, `*`."""
import re

TYPE_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
PATTERN_RE = re.compile(r"^(\*|[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*(\.\*)?)$")


def is_valid_type(value: str) -> bool:
    return bool(TYPE_RE.match(value))


def is_valid_pattern(value: str) -> bool:
    return bool(PATTERN_RE.match(value))


def matching_patterns(event_type: str) -> list[str]:
    """Every subscription pattern that matches `event_type`, so fan-out is one array-overlap query.

    `a.b.c` is matched by `a.b.c`, `a.b.*`, `a.*` and `*`.
    """
    segments = event_type.split(".")
    patterns = [event_type, "*"]
    patterns.extend(".".join(segments[:n]) + ".*" for n in range(1, len(segments)))
    return patterns
