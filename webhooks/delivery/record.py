"""The record of finished attempts: what follows an attempt.

The record itself (the attempt row, the lease released, the delivery moved on, the freed slot handed
on) is webhooks/delivery/attempts.py. Here: which way each attempt is recorded, the breaker's change
(webhooks/delivery/breaker.py), an endpoint disabled on a 410 and the operational events (SPEC §8) of the slow
path, the hand-on of freed slots to a worker's engine or the retry queue, and the attempt's metrics and
log line.
"""
import logging
from collections.abc import Callable
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from webhooks import event_types
from webhooks.conf import herald_settings
from webhooks.delivery import attempts, breaker, metrics
from webhooks.delivery.destinations import kinds
from webhooks.delivery.attempts import Outcome
from webhooks.delivery.claim import Claim
from webhooks.delivery.destinations.base import AttemptResult, Verdict
from webhooks.delivery.endpoints import breaker_write, endpoint_disable
from webhooks.delivery.fanout import event_emit_operational
from webhooks.delivery.publishing import deliveries_enqueue
from webhooks.logcontext import request_id
from webhooks.models import Delivery

logger = logging.getLogger("herald.delivery")


def deliveries_record(*, outcomes: list[Outcome],
                      take_handed_on: Callable[[list[str]], None] | None = None) -> list[str]:
    """Record finished attempts, move their deliveries on, update breakers, hand freed slots on.

    Successes on endpoints the claim saw healthy (nearly every attempt) are recorded together in one
    call. Anything else, and any of those whose endpoint turned out not to be healthy any more, takes
    the slow path: one transaction per attempt under the endpoint's lock that also updates the
    breaker, disables the endpoint on a 410, and records operational events (SPEC §8), except for
    deliveries of operational events. Returns each delivery's new status, in order.

    Parked deliveries given the freed slots go to `take_handed_on` (a worker's engine claims them itself),
    or else into the retry queue.
    """
    now = timezone.now()
    verdicts = [kinds.classify(o.claim.kind, o.result) for o in outcomes]
    decided = [attempts.delivery_decide(number=o.claim.number, verdict=v, now=now) for o, v in zip(outcomes, verdicts)]
    params = [attempts.record_params(o, status, next_at) for o, (status, next_at) in zip(outcomes, decided)]
    # per attempt: moved on, handed on, breaker transition, endpoint class (metrics.endpoint_class)
    done: dict[int, tuple[bool, list[str], str | None, str]] = {}
    healthy_successes = [i for i, o in enumerate(outcomes) if verdicts[i].ok and o.claim.endpoint_healthy]
    if healthy_successes:
        rows = attempts.record_healthy_successes([params[i] for i in healthy_successes])
        for i in healthy_successes:
            recorded, moved_on, handed = rows[outcomes[i].claim.delivery_id]
            if recorded:
                done[i] = (moved_on, handed, None, metrics.HEALTHY)
    for i, outcome in enumerate(outcomes):
        if i not in done:
            token = request_id.set(outcome.claim.request_id)  # for the operational events it may record
            try:
                done[i] = _record_slow(claim=outcome.claim, result=outcome.result, verdict=verdicts[i],
                                       status=decided[i][0], now=now, params=params[i])
            finally:
                request_id.reset(token)
    handed_on = [delivery_id for i in done for delivery_id in done[i][1]]
    if handed_on:
        if take_handed_on is not None:
            take_handed_on(handed_on)
        else:
            deliveries_enqueue(delivery_ids=handed_on, queue=herald_settings.queues.retries, wait=True)
    for i, outcome in enumerate(outcomes):
        moved_on, _, transition, endpoint_class = done[i]
        claim, result = outcome.claim, outcome.result
        metrics.record_attempt(result, endpoint=endpoint_class, transition=transition)
        logger.info("delivery.attempt", extra={
            "request_id": claim.request_id, "delivery_id": claim.delivery_id, "event_id": claim.event_id,
            "endpoint_id": claim.endpoint_id, "attempt": claim.number, "response_status": result.status,
            "error": result.error, "duration_ms": result.duration_ms,
            "outcome": decided[i][0] if moved_on else "superseded", "probe": claim.probe, "breaker": transition})
    return [status for status, _ in decided]


def delivery_record(*, claim: Claim, started_at: datetime, result: AttemptResult) -> str:
    """Record one finished attempt (see `deliveries_record`); the delivery's new status."""
    return deliveries_record(outcomes=[Outcome(claim, started_at, result)])[0]


def _record_slow(*, claim: Claim, result: AttemptResult, verdict: Verdict, status: str, now: datetime,
                 params: dict) -> tuple[bool, list[str], str | None, str]:
    notify = not event_types.is_reserved(claim.event_type)
    with transaction.atomic(), connection.cursor() as cursor:
        endpoint = attempts.lock_endpoint(cursor, claim.endpoint_id)
        change = breaker.after_attempt(
            state=endpoint.breaker, ok=verdict.ok, probe=claim.probe, now=now,
            threshold=herald_settings.breaker.WEBHOOK_BREAKER_FAILURES,
            base=herald_settings.breaker.WEBHOOK_BREAKER_COOLDOWN_SECONDS,
            maximum=herald_settings.breaker.WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS)
        gone = verdict.gone
        # Our slot goes to the oldest parked delivery; a recovered endpoint's whole cap opens at once.
        if not endpoint.active or gone or change.tripped_after(endpoint.breaker):
            slots_to_hand_on = 0
        else:
            slots_to_hand_on = endpoint.cap if change.transition == breaker.RECOVERED else 1
        if change.fields:  # first, so that the hand-on below sees the breaker as it now is
            breaker_write(endpoint_id=claim.endpoint_id, fields=change.fields)
        moved_on, handed = attempts.record_locked(cursor, params, slots_to_hand_on=slots_to_hand_on)
        if gone and endpoint.active:
            endpoint_disable(endpoint_id=claim.endpoint_id, reason="receiver answered 410 Gone", notify=notify)
        if notify:
            _emit_operational(claim=claim, change=change, result=result, failed=moved_on and status == Delivery.FAILED)
    return moved_on, handed, change.transition, metrics.endpoint_class(failing_since=endpoint.failing_since, now=now)


def _emit_operational(*, claim: Claim, change: breaker.BreakerChange, result: AttemptResult,
                      failed: bool) -> None:
    endpoint = {"endpoint_id": claim.endpoint_id, "url": claim.url}
    last = {"response_status": result.status, "error": result.error}
    if change.transition == breaker.TRIPPED:
        event_emit_operational(tenant_id=claim.tenant_id, event_type=event_types.ENDPOINT_TRIPPED, data={
            **endpoint, "consecutive_failures": change.fields["consecutive_failures"],
            "next_probe_at": change.fields["next_probe_at"].isoformat(), "last_attempt": last})
    elif change.transition == breaker.RECOVERED:
        event_emit_operational(tenant_id=claim.tenant_id, event_type=event_types.ENDPOINT_RECOVERED, data=endpoint)
    if failed:
        event_emit_operational(tenant_id=claim.tenant_id, event_type=event_types.DELIVERY_FAILED, data={
            "delivery_id": claim.delivery_id, "event_id": claim.event_id, "event_type": claim.event_type,
            **endpoint, "attempts": claim.number, "last_attempt": last})
