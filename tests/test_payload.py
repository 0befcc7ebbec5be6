"""Tests for the webhook JSON payload builder."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from webhooks.payload import build_payload

CREATED = datetime(2026, 11, 29, 23, 41, 22, 123456, tzinfo=timezone.utc)


def test_same_input_gives_identical_bytes():
    data = {"order": {"id": 7, "total": "12.50"}, "tags": ["a", "b"]}
    first = build_payload(event_type="order.created", created_at=CREATED, data=data)
    second = build_payload(event_type="order.created", created_at=CREATED, data=dict(data))
    assert first == second


def test_compact_json_in_type_timestamp_data_order():
    payload = build_payload(event_type="order.created", created_at=CREATED, data={"id": 7})
    assert payload == (
        b'{"type":"order.created","timestamp":"2026-11-29T23:41:22.123456Z","data":{"id":7}}'
    )


def test_parses_back():
    data = {"name": "Zoë ✓", "n": [1, 2.5, None, True]}
    payload = build_payload(event_type="user.renamed", created_at=CREATED, data=data)
    assert json.loads(payload) == {
        "type": "user.renamed",
        "timestamp": "2026-11-29T23:41:22.123456Z",
        "data": data,
    }


def test_non_ascii_is_utf8_not_escaped():
    payload = build_payload(event_type="t", created_at=CREATED, data="Zoë")
    assert "Zoë".encode() in payload
    assert b"\\u" not in payload


def test_non_utc_aware_datetime_is_converted_to_utc_z():
    paris_winter = timezone(timedelta(hours=1))
    created = datetime(2026, 11, 30, 0, 41, 22, 123456, tzinfo=paris_winter)
    timestamp = json.loads(build_payload(event_type="t", created_at=created, data=None))[
        "timestamp"
    ]
    assert timestamp == "2026-11-29T23:41:22.123456Z"
    assert timestamp.endswith("Z")
    assert datetime.fromisoformat(timestamp.replace("Z", "+00:00")) == CREATED


def test_whole_second_keeps_microseconds_for_a_fixed_width():
    created = CREATED.replace(microsecond=0)
    timestamp = json.loads(build_payload(event_type="t", created_at=created, data=None))[
        "timestamp"
    ]
    assert timestamp == "2026-11-29T23:41:22.000000Z"


def test_naive_datetime_is_refused():
    with pytest.raises(ValueError):
        build_payload(event_type="t", created_at=datetime(2026, 11, 29), data=None)

