"""An endpoint's circuit breaker: what one attempt's outcome does to it. Pure; the services write it.

Closed, an endpoint takes attempts up to its in-flight cap. After `threshold` consecutive failed
attempts it is tripped: no attempt starts until `next_probe_at`, then exactly one (the probe, claimed
like any attempt). A successful probe, or any success, closes it; a failed probe doubles the pause,
up to `maximum`. Waiting costs a delivery nothing: it is parked, not retried.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

TRIPPED = "tripped"
RECOVERED = "recovered"


@dataclass(frozen=True)
class BreakerState:
    """The breaker's columns of an endpoint row, as read under its lock."""

    consecutive_failures: int
    tripped_at: datetime | None
    failed_probes: int
    failing_since: datetime | None

    def changed(self, fields: dict[str, Any]) -> BreakerState:
        """The state once a change's fields are written (next_probe_at is not part of it)."""
        return dataclasses.replace(self, **{k: v for k, v in fields.items() if k in _STATE_FIELDS})

    @property
    def healthy(self) -> bool:
        """Not tripped, and no failure since the last success (webhooks/sql/endpoint_healthy.sql, the same
        rule for the claim and the record, which read it in PostgreSQL)."""
        return self.tripped_at is None and not self.consecutive_failures and self.failing_since is None


_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(BreakerState))


@dataclass(frozen=True)
class BreakerChange:
    """Endpoint columns to write (empty when nothing changes) and the transition, if one happened."""

    fields: dict[str, Any] = field(default_factory=dict)
    transition: str | None = None

    def tripped_after(self, state: BreakerState) -> bool:
        return self.fields.get("tripped_at", state.tripped_at) is not None


def cooldown_seconds(failed_probes: int, *, base: float, maximum: float) -> float:
    """The pause before the next probe: `base`, doubled for every failed probe so far, capped."""
    return min(base * 2 ** min(failed_probes, 32), maximum)


def after_attempt(*, state: BreakerState, ok: bool, probe: bool, now: datetime, threshold: int, base: float,
                  maximum: float) -> BreakerChange:
    """The breaker after one recorded attempt (`probe`: the one attempt let through while tripped)."""
    if ok:
        if state.healthy:
            return BreakerChange()
        return BreakerChange({"consecutive_failures": 0, "failing_since": None, "tripped_at": None,
                              "next_probe_at": None, "failed_probes": 0},
                             RECOVERED if state.tripped_at is not None else None)
    failures = state.consecutive_failures + 1
    fields: dict[str, Any] = {"consecutive_failures": failures, "failing_since": state.failing_since or now}
    if state.tripped_at is not None:
        # An attempt that started before the trip and failed after it says nothing new; a failed
        # probe lengthens the pause.
        if probe:
            failed = state.failed_probes + 1
            fields.update(failed_probes=failed, next_probe_at=now + timedelta(
                seconds=cooldown_seconds(failed, base=base, maximum=maximum)))
        return BreakerChange(fields)
    if failures >= threshold:
        fields.update(tripped_at=now, failed_probes=0, next_probe_at=now + timedelta(
            seconds=cooldown_seconds(0, base=base, maximum=maximum)))
        return BreakerChange(fields, TRIPPED)
    return BreakerChange(fields)
