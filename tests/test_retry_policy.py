"""Tests for the retry schedule, jittered delays and Retry-After parsing."""

import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from webhooks.delivery.retry_policy import next_delay, parse_retry_after, parse_schedule

SCHEDULE = (5, 300, 1800)
NOW = datetime(2026, 11, 29, 23, 41, 22, tzinfo=timezone.utc)


def test_parse_schedule():
    assert parse_schedule("5,300,1800") == (5, 300, 1800)
    assert parse_schedule(" 0, 5 ,60 ") == (0, 5, 60)
    assert parse_schedule("10") == (10,)


@pytest.mark.parametrize("text", ["", " ", "5,,300", "5,300,", "a,5", "5,-1", "1.5", "5;300", "+3"])
def test_parse_schedule_rejects_junk(text):
    with pytest.raises(ValueError):
        parse_schedule(text)


def test_delays_follow_the_schedule_without_jitter():
    delays = [next_delay(attempt_number=n, schedule=SCHEDULE, jitter=0) for n in (1, 2, 3)]
    assert delays == [5.0, 300.0, 1800.0]


def test_exhausted_after_the_last_entry():
    assert next_delay(attempt_number=4, schedule=SCHEDULE, jitter=0.2) is None
    assert next_delay(attempt_number=1, schedule=(), jitter=0.2) is None
    assert next_delay(attempt_number=4, schedule=SCHEDULE, jitter=0, retry_after=60) is None


def test_jitter_stays_within_bounds_and_spreads():
    rng = random.Random(1234)
    draws = [
        next_delay(attempt_number=2, schedule=SCHEDULE, jitter=0.2, rng=rng) for _ in range(5000)
    ]
    assert min(draws) >= 300 * 0.8
    assert max(draws) <= 300 * 1.2
    # Actually spread over the range, not a constant.
    assert min(draws) < 300 * 0.85
    assert max(draws) > 300 * 1.15


def test_seeded_rng_is_reproducible():
    first = [next_delay(attempt_number=1, schedule=SCHEDULE, jitter=0.5, rng=random.Random(7)) for _ in range(3)]
    second = [next_delay(attempt_number=1, schedule=SCHEDULE, jitter=0.5, rng=random.Random(7)) for _ in range(3)]
    assert first == second


def test_retry_after_pushes_the_next_attempt_later():
    assert next_delay(attempt_number=1, schedule=SCHEDULE, jitter=0, retry_after=120) == 120.0


def test_retry_after_never_shortens_the_delay():
    assert next_delay(attempt_number=2, schedule=SCHEDULE, jitter=0, retry_after=10) == 300.0


def test_retry_after_is_capped_at_the_longest_scheduled_delay():
    assert (
        next_delay(attempt_number=1, schedule=SCHEDULE, jitter=0, retry_after=86400) == 1800.0
    )


def test_invalid_arguments():
    with pytest.raises(ValueError):
        next_delay(attempt_number=0, schedule=SCHEDULE, jitter=0)
    with pytest.raises(ValueError):
        next_delay(attempt_number=1, schedule=SCHEDULE, jitter=1.5)


def test_parse_retry_after_seconds():
    assert parse_retry_after("120", now=NOW) == 120.0
    assert parse_retry_after(" 0 ", now=NOW) == 0.0


def test_parse_retry_after_http_date():
    value = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert value.endswith("GMT")
    assert parse_retry_after(value, now=NOW) == 90.0


def test_parse_retry_after_date_in_the_past_is_zero():
    value = format_datetime(NOW - timedelta(hours=1), usegmt=True)
    assert parse_retry_after(value, now=NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5", "Wed, 99 Foo 2026 25:00:00 GMT"])
def test_parse_retry_after_garbage_is_none(value):
    assert parse_retry_after(value, now=NOW) is None
