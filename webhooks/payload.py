"""Build the deterministic JSON body of a webhook message."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any


def format_timestamp(value: datetime) -> str:
    """Return ``value`` as ISO 8601 in UTC with microseconds and a ``Z`` suffix."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("created_at must be timezone-aware")
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_payload(*, event_type: str, created_at: datetime, data: Any) -> bytes:
    """Return compact UTF-8 JSON ``{"type", "timestamp", "data"}``; same input, same bytes."""
    document = {
        "type": event_type,
        "timestamp": format_timestamp(created_at),
        "data": data,
    }
    return json.dumps(
        document, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
