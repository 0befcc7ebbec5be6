"""What every destination is behind: an attempt's result, the verdict on it, and the kind's protocol.

A destination (one module of this package per kind, registered in `__init__`) turns one claimed
delivery's message into an attempt: `prepare` (what the attempt sends: the signed headers, the kind's
target), `send` (the attempt itself, within its deadline, never raising for a failed one: its
AttemptResult says what happened) and `classify` (what the result means for the delivery: delivered,
gone for good, or to be retried, maybe not before a time the destination was told).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttemptResult:
    """Outcome of one delivery attempt; ``error`` is empty when the request completed."""

    status: int | None
    body: str
    duration_ms: int
    error: str
    retry_after: str | None

    # A destination without statuses said yes: a broker's confirm, its stream's ack or the entry's id.
    accepted: bool = False

    @property
    def ok(self) -> bool:
        if self.error:
            return False
        return self.accepted or (self.status is not None and 200 <= self.status < 300)


@dataclass(frozen=True)
class Verdict:
    """What an attempt's result means for its delivery (a destination's `classify`)."""

    ok: bool
    gone: bool = False  # the destination is gone for good (HTTP 410): the endpoint is disabled, no retry
    retry_after: str | None = None  # not again before this (an HTTP Retry-After), within the schedule's longest step
