"""The `poll` destination (SPEC §12): Herald never sends; the endpoint's consumer reads its messages.

Not pushed: intake gives its deliveries no outbox row and no next_attempt_at, so no relay publishes them and
the claim (which takes only due deliveries) never sends one; webhooks/services/polling.py serves them, and a
read past a cursor acknowledges them (an attempt of its own, succeeded). It takes no URL, access or broker
fields.
"""
from __future__ import annotations

from webhooks.delivery.destinations.base import AttemptResult, Verdict

kind = "poll"
pushed = False


def classify(result: AttemptResult) -> Verdict:
    return Verdict(ok=result.ok)
