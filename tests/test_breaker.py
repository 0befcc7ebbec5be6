"""The circuit breaker's rules, as a pure function of one attempt's outcome."""
from datetime import datetime, timedelta, timezone

from webhooks.delivery import breaker

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
RULES = {"threshold": 3, "base": 30, "maximum": 600}
CLOSED = breaker.BreakerState(consecutive_failures=0, tripped_at=None, failed_probes=0, failing_since=None)


def after(state, ok, probe=False):
    return breaker.after_attempt(state=state, ok=ok, probe=probe, now=NOW, **RULES)


def test_a_success_on_a_healthy_endpoint_writes_nothing():
    assert after(CLOSED, ok=True) == breaker.BreakerChange()


def test_failures_count_up_and_trip_at_the_threshold():
    change = after(CLOSED, ok=False)
    assert change.fields == {"consecutive_failures": 1, "failing_since": NOW} and change.transition is None
    two = breaker.BreakerState(2, None, 0, NOW - timedelta(minutes=1))
    change = after(two, ok=False)
    assert change.transition == breaker.TRIPPED
    assert change.fields["tripped_at"] == NOW
    assert change.fields["next_probe_at"] == NOW + timedelta(seconds=30)
    assert change.fields["failing_since"] == NOW - timedelta(minutes=1)  # the failure clock keeps running
    assert change.tripped_after(two)


def test_each_failed_probe_doubles_the_pause_up_to_the_maximum():
    pauses = []
    state = breaker.BreakerState(3, NOW, 0, NOW)
    for _ in range(7):
        change = after(state, ok=False, probe=True)
        assert change.transition is None and change.tripped_after(state)
        pauses.append((change.fields["next_probe_at"] - NOW).total_seconds())
        state = breaker.BreakerState(change.fields["consecutive_failures"], NOW, change.fields["failed_probes"], NOW)
    assert pauses == [60, 120, 240, 480, 600, 600, 600]


def test_a_failure_that_started_before_the_trip_does_not_lengthen_the_pause():
    tripped = breaker.BreakerState(5, NOW, 1, NOW)
    change = after(tripped, ok=False, probe=False)
    assert "next_probe_at" not in change.fields and "failed_probes" not in change.fields
    assert change.fields["consecutive_failures"] == 6


def test_a_successful_probe_closes_the_breaker_and_clears_the_failure_clock():
    change = after(breaker.BreakerState(7, NOW, 2, NOW - timedelta(hours=1)), ok=True, probe=True)
    assert change.transition == breaker.RECOVERED
    assert change.fields == {"consecutive_failures": 0, "failing_since": None, "tripped_at": None,
                             "next_probe_at": None, "failed_probes": 0}


def test_a_success_below_the_threshold_resets_the_count_without_a_transition():
    change = after(breaker.BreakerState(2, None, 0, NOW), ok=True)
    assert change.transition is None and change.fields["consecutive_failures"] == 0


def test_cooldown_is_capped():
    assert breaker.cooldown_seconds(0, base=30, maximum=600) == 30
    assert breaker.cooldown_seconds(10**6, base=30, maximum=600) == 600
