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
from webhooks.delivery.claim import Claim, Claims, claim_rows, claims_from_rows
from webhooks.delivery.destinations.base import AttemptResult, Verdict
from webhooks.delivery.endpoints import breakers_write, endpoint_disable
from webhooks.delivery.fanout import event_emit_operational
from webhooks.delivery.publishing import deliveries_enqueue
from webhooks.logcontext import request_id
from webhooks.models import Delivery

logger = logging.getLogger("herald.delivery")


def deliveries_record(*, outcomes: list[Outcome],
                      take_claimed: Callable[[Claims], None] | None = None) -> list[str]:
    """Record finished attempts, move their deliveries on, update breakers, hand freed slots on.

    Successes on endpoints the claim saw healthy (nearly every attempt) are recorded together in one
    call. Anything else, and any of those whose endpoint turned out not to be healthy any more, takes
    the slow path: one transaction for them all under their endpoints' locks that also updates the
    breakers, disables an endpoint on a 410, and records operational events (SPEC §8), except for
    deliveries of operational events. Returns each delivery's new status, in order.

    Parked deliveries given the freed slots are, with `take_claimed` (a worker's engine), claimed in the same
    transaction as the record that freed the slots (so that no claim of a fresh delivery can take a slot
    between the two and send the handed-on one back to its park) and passed to it once committed (a throttled
    endpoint's too: the engine starts them their interval apart, `pacing.Pacing`); without it they go into the
    retry queue.
    """
    now = timezone.now()
    verdicts = [kinds.classify(o.claim.kind, o.result) for o in outcomes]
    decided = [attempts.delivery_decide(number=o.claim.number, verdict=v, now=now) for o, v in zip(outcomes, verdicts)]
    params = [attempts.record_params(o, status, next_at) for o, (status, next_at) in zip(outcomes, decided)]
    # per attempt: moved on, handed on, breaker transition, endpoint class (metrics.endpoint_class)
    done: dict[int, tuple[bool, list[str], str | None, str]] = {}
    healthy_successes = [i for i, o in enumerate(outcomes) if verdicts[i].ok and o.claim.endpoint_healthy]

    def claim_handed(cursor, handed: dict[str, str]) -> list[tuple]:
        # in the record's transaction: the claim of the deliveries its freed slots went to (their rows)
        return claim_rows(cursor, list(handed)) if handed else []

    then = claim_handed if take_claimed is not None else None
    claimed: list[tuple] = []
    if healthy_successes:
        rows, got = attempts.record_healthy_successes([params[i] for i in healthy_successes], then=then)
        claimed += got or []
        for i in healthy_successes:
            recorded, moved_on, handed = rows[outcomes[i].claim.delivery_id]
            if recorded:
                done[i] = (moved_on, handed, None, metrics.HEALTHY)
    slow = [i for i in range(len(outcomes)) if i not in done]
    if slow:
        slow_done, got = _record_slow([(i, outcomes[i], verdicts[i], decided[i][0], params[i]) for i in slow],
                                      now=now, then=then)
        done.update(slow_done)
        claimed += got or []
    handed_on = [delivery_id for i in done for delivery_id in done[i][1]]
    if handed_on:
        if take_claimed is not None:
            take_claimed(claims_from_rows(claimed))
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


def _record_slow(items: list[tuple[int, Outcome, Verdict, str, dict]], *, now: datetime,
                 then=None) -> tuple[dict[int, tuple[bool, list[str], str | None, str]], object]:
    """The slow path for a batch, in one transaction: its endpoints locked (in id order), each attempt's breaker
    change worked out in turn from its endpoint's state after the ones before it, the breakers written in one
    statement, the attempts recorded in one call, then the 410s' disables and the operational events (and, with
    `then`, `then(cursor, {handed id: the recorded delivery's id})`, whose result is returned beside). A failing
    endpoint's attempts cost the recorder a few statements in all, not a transaction each, so one tenant
    whose endpoints fail in bulk does not hold up the claims of everyone else's (SPEC §10)."""
    limits = herald_settings.breaker
    with transaction.atomic(), connection.cursor() as cursor:
        endpoints = attempts.lock_endpoints(cursor, [outcome.claim.endpoint_id for _, outcome, *_ in items])
        states = {endpoint_id: endpoint.breaker for endpoint_id, endpoint in endpoints.items()}
        active = {endpoint_id: endpoint.active for endpoint_id, endpoint in endpoints.items()}
        fields: dict[str, dict] = {}
        records, changes, classes, disable = [], [], [], []
        for _, outcome, verdict, _, params in items:
            claim, endpoint = outcome.claim, endpoints[outcome.claim.endpoint_id]
            state = states[claim.endpoint_id]
            change = breaker.after_attempt(state=state, ok=verdict.ok, probe=claim.probe, now=now,
                                           threshold=limits.WEBHOOK_BREAKER_FAILURES,
                                           base=limits.WEBHOOK_BREAKER_COOLDOWN_SECONDS,
                                           maximum=limits.WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS)
            # Its slot goes to the oldest parked delivery; a recovered endpoint's whole cap opens at once.
            if not active[claim.endpoint_id] or verdict.gone or change.tripped_after(state):
                slots = 0
            else:
                slots = endpoint.cap if change.transition == breaker.RECOVERED else 1
            classes.append(metrics.endpoint_class(failing_since=state.failing_since, now=now))
            states[claim.endpoint_id] = state.changed(change.fields)
            fields.setdefault(claim.endpoint_id, {}).update(change.fields)
            if verdict.gone and active[claim.endpoint_id]:
                active[claim.endpoint_id] = False
                disable.append((claim.endpoint_id, not event_types.is_reserved(claim.event_type)))
            records.append((params, slots))
            changes.append(change)
        # first, so that the hand-ons below see the breakers as they now are
        breakers_write(cursor, fields)
        recorded = attempts.record_locked(cursor, records, claiming=then is not None)
        for endpoint_id, notify in disable:
            endpoint_disable(endpoint_id=endpoint_id, reason="receiver answered 410 Gone", notify=notify)
        done = {}
        for (i, outcome, _, status, _), change, endpoint_class in zip(items, changes, classes):
            moved_on, handed = recorded[outcome.claim.delivery_id]
            if not event_types.is_reserved(outcome.claim.event_type):
                token = request_id.set(outcome.claim.request_id)  # for the operational events it records
                try:
                    _emit_operational(claim=outcome.claim, change=change, result=outcome.result,
                                      failed=moved_on and status == Delivery.FAILED)
                finally:
                    request_id.reset(token)
            done[i] = (moved_on, handed, change.transition, endpoint_class)
        extra = (then(cursor, {i: delivery_id for delivery_id, (_, handed) in recorded.items() for i in handed})
                 if then is not None else None)
    return done, extra


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
