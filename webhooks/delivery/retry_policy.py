"""Retry schedule: parse it, compute the next delay (jitter, Retry-After), parse Retry-After."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime


def parse_schedule(text: str) -> tuple[int, ...]:
    """Parse ``"5,300,1800"`` into ``(5, 300, 1800)``; ValueError on junk, negatives or empty."""
    if not text.strip():
        raise ValueError("retry schedule is empty")
    parts = [part.strip() for part in text.split(",")]
    delays: list[int] = []
    for part in parts:
        if not part.isdigit() or not part.isascii():  # rejects "", "-5", "1.5", "+3", "٣"
            raise ValueError(
                f"invalid retry schedule {text!r}: {part!r} is not a whole number of seconds >= 0"
            )
        delays.append(int(part))
    return tuple(delays)


def next_delay(
    *,
    attempt_number: int,
    schedule: Sequence[int],
    jitter: float,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds to wait after failed attempt ``attempt_number`` (1-based), or None when exhausted.

    Delay is ``schedule[attempt_number - 1]`` scaled by ``uniform(1 - jitter, 1 + jitter)``;
    a receiver's Retry-After can push it later, but never beyond ``max(schedule)``.
    """
    if attempt_number < 1:
        raise ValueError("attempt_number is 1-based")
    if not 0 <= jitter <= 1:
        raise ValueError("jitter must be between 0 and 1")
    if attempt_number > len(schedule):
        return None
    base = float(schedule[attempt_number - 1])
    factor = (rng or random).uniform(1 - jitter, 1 + jitter) if jitter else 1.0
    delay = base * factor
    if retry_after is not None and retry_after > 0:
        delay = max(delay, min(float(retry_after), float(max(schedule))))
    return delay


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds asked for by a Retry-After header (delta-seconds or HTTP-date); None if unusable."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:  # older Pythons returned None for garbage
        return None
    if when.tzinfo is None:  # "-0000" means UTC per RFC 5322
        when = when.replace(tzinfo=timezone.utc)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
