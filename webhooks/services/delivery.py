"""Delivery services: claim a delivery within its endpoint's limits, send one signed attempt, record it.

PostgreSQL holds every bit of state (attempt_count, next_attempt_at, the lease, the breaker), so a
lost or duplicated Celery message can neither lose a delivery nor send it twice at once.

Every claim and every record of an endpoint's delivery first takes that endpoint's row lock (`FOR NO
KEY UPDATE`, which intake's foreign-key checks do not wait for). Under it the claim counts the live
leases against the endpoint's cap and reads its breaker, ordering and throttle; a delivery that may
not go now is *parked*: no attempt, no retry step, no worker held. The record, under the same lock,
releases the lease and hands the oldest parked delivery on (to the worker's engine, or else into the
queue). Because both sides hold the lock, a delivery can never park just after the last attempt in
flight looked for someone to hand its slot to. The claim and the record are PL/pgSQL functions:
webhooks/sql/ has them and their rules, one file each.
"""
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
import pycurl
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from webhooks import access as access_mod
from webhooks import breaker, crypto, event_types, metrics, progress, retry_policy, signing, tracing, transport
from webhooks.logcontext import request_id
from webhooks.models import Delivery, DeliveryLease, DeliveryOutbox, Endpoint, Event
from webhooks.publishing import broker_backlog, deliveries_enqueue, publisher
from webhooks.services.endpoints import endpoint_disable
from webhooks.services.events import event_emit_operational, poll_notify

logger = logging.getLogger("herald.delivery")

_DELIVERY = Delivery._meta.db_table
_ENDPOINT = Endpoint._meta.db_table
_LEASE = DeliveryLease._meta.db_table
_OUTBOX = DeliveryOutbox._meta.db_table

# The endpoint's row, locked, with what the record's slow path decides on (in its own transaction).
_LOCK_ENDPOINT_SQL = f"""
SELECT ep.id, ep.tenant_id, ep.url, ep.enabled AND ep.deleted_at IS NULL, ep.deleted_at IS NOT NULL,
       coalesce(ep.max_in_flight, %(default_cap)s), ep.tripped_at, ep.next_probe_at <= now(),
       ep.consecutive_failures, ep.failed_probes, ep.failing_since
  FROM {_ENDPOINT} ep
 WHERE ep.id = %(endpoint)s
   FOR NO KEY UPDATE
"""
# The functions are defined, and their rules explained, in webhooks/sql/ (one file each).
# The claimed deliveries come with their endpoints' access (headers, auth, client certificate) in the same
# statement, so that access costs no round trip of its own: on one claimed delivery per endpoint (NULLs on
# the others, and for an endpoint without any), so that a batch reads and decodes each endpoint's once.
_CLAIM_MANY_SQL = f"""
WITH c AS (SELECT * FROM herald_delivery_claim_many(%(ids)s, %(lease)s, %(default_cap)s)),
     first AS (SELECT DISTINCT ON (endpoint_id) delivery_id, endpoint_id FROM c WHERE go)
SELECT c.*, {access_mod.ACCESS_COLUMNS}
  FROM c
  LEFT JOIN first f ON f.delivery_id = c.delivery_id
  LEFT JOIN {access_mod.ACCESS_TABLE} a ON a.endpoint_id = f.endpoint_id
"""
_RECORD_MANY_SQL = "SELECT * FROM herald_delivery_record_many(%(records)s::jsonb, %(default_cap)s)"
# The slow path records under the endpoint lock it already holds, in its own transaction.
_RECORD_SQL = """
SELECT * FROM herald_delivery_record(%(id)s, %(number)s, %(started_at)s, %(duration_ms)s, %(response_status)s,
    %(response_body)s, %(error)s, %(status)s, %(next_attempt_at)s, %(lease_end)s, %(endpoint)s, %(default_cap)s,
    %(fast)s, %(hand_on)s)
"""

# Besides the relay's step (webhooks/relay.py: the outbox's due, unpublished rows: new deliveries and
# retries that have come due), beat's dispatcher publishes again, each found by an index range scan
# that touches only rows it will publish (a million retries scheduled for later, or a long backlog
# waiting in a queue, cost nothing):
# - deliveries whose message was lost: published before their queue's cutoff and never claimed (a
#   claim deletes the outbox row; outbox_published). The cutoff comes from the queue's progress
#   (webhooks/progress.py): queues are first in, first out, so what was published well before the
#   newest message the workers consumed is no longer in the queue; an empty queue holds nothing, so
#   anything published before WEBHOOK_REDISPATCH_AFTER_SECONDS ago is lost (flush, restart, a worker
#   killed with messages taken). The row's `periodic` says which queue its message went to; whatever
#   the dispatcher publishes again goes to the periodic one;
# - deliveries claimed by a worker that died (their lease ran out with no record; the claim had
#   deleted their outbox row, so they get one again).
# A parked delivery is in no queue and not the dispatcher's business: its endpoint hands it on.
_DISPATCH_SQL = f"""
WITH lost AS (
    SELECT o.delivery_id FROM {_OUTBOX} o
     WHERE o.published_at < %(cutoff)s
       AND CASE WHEN o.periodic THEN o.published_at < %(cutoff_periodic)s
                ELSE o.published_at < %(cutoff_main)s END
       AND NOT EXISTS (SELECT 1 FROM {_LEASE} l WHERE l.delivery_id = o.delivery_id AND l.until > now())
     ORDER BY o.published_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
), republished AS (
    UPDATE {_OUTBOX} o SET published_at = now(), periodic = true
     WHERE o.delivery_id = ANY(ARRAY(SELECT delivery_id FROM lost))
    RETURNING o.delivery_id, o.periodic, o.published_at
), orphaned AS (
    SELECT d.id FROM {_LEASE} l JOIN {_DELIVERY} d ON d.id = l.delivery_id
     WHERE l.until <= now() AND d.status = 'pending' AND d.parked_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM {_OUTBOX} o WHERE o.delivery_id = d.id)
     LIMIT %(batch)s
     FOR UPDATE OF d SKIP LOCKED
), rescued AS (
    INSERT INTO {_OUTBOX} AS o (delivery_id, due_at, published_at, periodic)
    SELECT id, now(), now(), true FROM orphaned
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING o.delivery_id, o.periodic, o.published_at
), expired AS (
    -- leases whose worker died: taken into account above, and of no use to anyone any more
    DELETE FROM {_LEASE} WHERE until <= now()
)
SELECT * FROM republished UNION ALL SELECT * FROM rescued
"""

# Beat: a tripped endpoint whose pause is over gets its probe: its oldest parked delivery goes back
# into a queue (a due retry of it would do as well; the first claim after next_probe_at is the probe).
_WAKE_PROBES_SQL = f"""
WITH ready AS (
    SELECT id FROM {_ENDPOINT}
     WHERE tripped_at IS NOT NULL AND next_probe_at <= now() AND enabled AND deleted_at IS NULL
       FOR NO KEY UPDATE SKIP LOCKED
), woken AS (
    UPDATE {_DELIVERY} SET parked_at = NULL, updated_at = now()
     WHERE id IN (SELECT (SELECT d.id FROM {_DELIVERY} d WHERE d.endpoint_id = ready.id AND d.parked_at IS NOT NULL
                           ORDER BY d.id LIMIT 1)
                    FROM ready)
    RETURNING id
), published AS (
    INSERT INTO {_OUTBOX} AS o (delivery_id, due_at, published_at, periodic)
    SELECT id, now(), now(), true FROM woken
    ON CONFLICT (delivery_id) DO UPDATE SET published_at = now(), periodic = true
)
SELECT id FROM woken
"""

# Beat's safety net: an endpoint with parked deliveries and no attempt in flight has no one to hand
# them on (that takes a lost hand-on message *and* a lost lease); send up to its cap on. The endpoints
# with parked deliveries are found by skipping through the parked index, so a long parked backlog
# costs one index probe per endpoint, not one per delivery.
_SWEEP_SQL = f"""
WITH RECURSIVE parked(endpoint_id) AS (
    (SELECT endpoint_id FROM {_DELIVERY} WHERE parked_at IS NOT NULL ORDER BY endpoint_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.endpoint_id FROM {_DELIVERY} d
             WHERE d.parked_at IS NOT NULL AND d.endpoint_id > p.endpoint_id ORDER BY d.endpoint_id LIMIT 1)
      FROM parked p WHERE p.endpoint_id IS NOT NULL
), idle AS (
    SELECT ep.id FROM {_ENDPOINT} ep JOIN parked p ON p.endpoint_id = ep.id
     WHERE ep.tripped_at IS NULL AND ep.enabled AND ep.deleted_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM {_LEASE} l WHERE l.endpoint_id = ep.id AND l.until > now())
       FOR NO KEY UPDATE OF ep SKIP LOCKED
)
SELECT unnest(herald_endpoint_hand_on(idle.id, %(default_cap)s, 1000)) FROM idle
"""

# A worker's engine wakes a throttled endpoint when its next attempt may start: under the endpoint's
# lock, the oldest parked delivery (if any) is handed on.
_WAKE_SQL = f"""
SELECT unnest(herald_endpoint_hand_on(ep.id, %(default_cap)s, 1000))
  FROM (SELECT id FROM {_ENDPOINT} WHERE id = %(endpoint)s FOR NO KEY UPDATE) ep
"""


@dataclass(frozen=True)
class EndpointState:
    """An endpoint's row as read under its lock."""

    id: str
    tenant_id: str
    url: str
    active: bool
    deleted: bool
    cap: int
    tripped_at: datetime | None
    probe_due: bool | None
    consecutive_failures: int
    failed_probes: int
    failing_since: datetime | None

    @property
    def breaker(self) -> breaker.BreakerState:
        return breaker.BreakerState(self.consecutive_failures, self.tripped_at, self.failed_probes,
                                    self.failing_since)


@dataclass(frozen=True)
class Claim:
    """A delivery this worker holds until `lease_end`, with what its attempt needs."""

    delivery_id: str
    number: int
    lease_end: datetime
    event_id: str
    event_type: str
    endpoint_id: str
    tenant_id: str
    payload: bytes
    request_id: str
    url: str
    secrets: list[str]
    probe: bool
    endpoint_healthy: bool  # as the claim saw it: not tripped, no failure counted
    access: access_mod.Access | None = None  # extra headers, auth, client certificate (SPEC §11)


def _lock_endpoint(cursor, params: dict) -> EndpointState:
    cursor.execute(_LOCK_ENDPOINT_SQL, {**params, "default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT})
    return EndpointState(*cursor.fetchone())


def _call(sql: str, params: dict) -> list[tuple]:
    """Run one statement (a claim or record function) as its own transaction; return its rows.

    In a threaded worker the connection comes straight from its psycopg pool, without Django's
    per-checkout bookkeeping; a connection found broken (PostgreSQL restarted) is dropped and the
    call made once more on a fresh one. The functions are safe to repeat: one that did commit finds
    nothing left to do the second time.
    """
    if connection.in_atomic_block:
        raise RuntimeError("a delivery is claimed and recorded in transactions of its own, not inside another")
    for attempt in (1, 2):
        with _raw_connection() as raw:
            try:
                with raw.cursor() as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchall()
            except psycopg.OperationalError:
                if attempt == 2 or not raw.closed:
                    raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _raw_connection():
    pool = connection.pool  # the worker's psycopg pool (config/celery.py), or None
    if pool is None:
        connection.ensure_connection()
        with connection.wrap_database_errors:
            yield connection.connection
        return
    pool.open()  # a no-op once open
    raw = pool.getconn()
    try:
        yield raw
    finally:
        pool.putconn(raw)  # a broken connection is discarded and replaced by the pool


@dataclass
class Claims:
    """What a batch of claims got: the leases taken, and when each throttled endpoint of the batch may
    start its next attempt (someone must hand its parked deliveries on then)."""

    claims: dict[str, Claim]
    wake_at: dict[str, datetime]


def deliveries_claim(*, delivery_ids: list[str]) -> Claims:
    """Take the leases of due deliveries, each within its endpoint's rules, in one call.

    A delivery missing from the claims has nothing to send now: not due, not pending, held by another
    worker, parked (its endpoint is at its cap, tripped, throttled, or fifo with an older delivery
    pending), or closed because its endpoint is disabled or deleted. A duplicate task is harmless:
    the second claim finds the lease taken.
    """
    rows = _call(_CLAIM_MANY_SQL, {"ids": list(dict.fromkeys(delivery_ids)), "lease": settings.WEBHOOK_LEASE_SECONDS,
                                   "default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT})
    claims, wake_at = {}, {}
    width = len(access_mod.ACCESS_COLUMNS.split(","))
    found, broken = access_mod.access_from_rows([(row[8], *row[-width + 1:]) for row in rows if row[-width]])
    for row in rows:
        (delivery_id, go, number, lease_end, event_id, event_type, payload, req_id, endpoint_id, tenant_id, url,
         tripped, healthy, secrets, wake) = row[:-width]
        if go:
            try:
                plain = [crypto.decrypt(secret) for secret in secrets]
            except crypto.InvalidToken:
                # HERALD_ENCRYPTION_KEYS (or SECRET_KEY) no longer opens this endpoint's secrets: sending
                # unsigned is no option. The lease runs out, and the dispatcher sends it again later.
                logger.error("delivery.secret_undecryptable", extra={"delivery_id": delivery_id,
                                                                     "endpoint_id": endpoint_id})
                continue
            if endpoint_id in broken:
                # Its headers, auth or private key no configured key opens: sent without them it would fail
                # (or reach the receiver unauthenticated). As above, the lease runs out.
                logger.error("delivery.access_undecryptable", extra={"delivery_id": delivery_id,
                                                                     "endpoint_id": endpoint_id})
                continue
            claims[delivery_id] = Claim(delivery_id, number, lease_end, event_id, event_type, endpoint_id, tenant_id,
                                        bytes(payload), req_id, url, plain, probe=tripped, endpoint_healthy=healthy,
                                        access=found.get(endpoint_id))
        if wake is not None:
            wake_at[endpoint_id] = min(wake, wake_at.get(endpoint_id, wake))
    return Claims(claims, wake_at)


def delivery_claim(*, delivery_id: str) -> Claim | None:
    """One delivery's claim (see `deliveries_claim`)."""
    return deliveries_claim(delivery_ids=[delivery_id]).claims.get(delivery_id)


def endpoint_wake(*, endpoint_id: str) -> list[str]:
    """Hand a throttled endpoint's parked deliveries on, as many as it may start now (see _WAKE_SQL)."""
    return [row[0] for row in _call(_WAKE_SQL, {"endpoint": endpoint_id,
                                                "default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT})]


def attempt_headers(claim: Claim) -> dict[str, str]:
    """The signed headers of one attempt (its own timestamp; one signature per active secret)."""
    return message_headers(secrets=claim.secrets, event_id=claim.event_id, payload=claim.payload)


def message_headers(*, secrets: list[str], event_id: str, payload: bytes) -> dict[str, str]:
    """The Standard Webhooks headers a message carries now: sent with an attempt, or served to a poll
    endpoint's consumer (webhooks/services/polling.py)."""
    return signing.webhook_headers(secrets=secrets, msg_id=event_id, timestamp=int(time.time()),
                                   body=payload, user_agent=f"Herald/{settings.HERALD_VERSION}")


def delivery_attempt(*, delivery_id: str) -> str | None:
    """Claim, send and record one attempt of the delivery on this thread; its new status, or None if skipped.

    A threaded worker's tasks go through its engine (webhooks/engine.py) instead, which does the same
    for many deliveries at once.
    """
    trace = None
    with tracing.batch("herald.claim.batch", 1) as claim_batch:
        claim = delivery_claim(delivery_id=delivery_id)
        if claim is not None and claim_batch is not None:
            trace = tracing.delivery_traces({delivery_id: claim}, claim_batch,
                                            {delivery_id: claim_batch.origin})[delivery_id]
    if claim is None:
        return None
    started_at = timezone.now()
    result = attempt_send(claim, trace=trace)
    if trace is None:
        return delivery_record(claim=claim, started_at=started_at, result=result)
    status, record_batch = None, tracing.batch("herald.record.batch", 1)
    try:
        with record_batch:
            status = delivery_record(claim=claim, started_at=started_at, result=result)
    finally:
        trace.recorded(status, record_batch)
    return status


def attempt_prepare(claim: Claim, *, timeout: float | None = None) -> access_mod.Prepared:
    """What the claim's attempt sends with: its signed headers, the endpoint's access (a token fetched if
    need be) and the proxy's route; blocks for a token fetch or a proxied host's lookup (see
    access_mod.needs_thread)."""
    return access_mod.prepare(url=claim.url, headers=attempt_headers(claim), access=claim.access,
                              timeout=settings.WEBHOOK_TIMEOUT_SECONDS if timeout is None else timeout)


def attempt_failed_early(prepared: access_mod.Prepared) -> transport.AttemptResult:
    """The result of an attempt that failed before sending (no token, the proxied host refused)."""
    return transport.AttemptResult(status=None, body="", duration_ms=prepared.spent_ms, error=prepared.error,
                                   retry_after=None)


def attempt_open(curl, claim: Claim, prepared: access_mod.Prepared) -> transport.Attempt:
    """The claim's attempt, set up on `curl` (see transport.Attempt)."""
    return transport.Attempt(curl, url=claim.url, body=claim.payload, headers=prepared.headers,
                             timeout=prepared.timeout, allow_private_networks=settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS,
                             auth=prepared.auth, client_cert=prepared.client_cert, route=prepared.route,
                             ca_file=settings.WEBHOOK_CA_BUNDLE or None, header_lines=prepared.header_lines)


def attempt_send(claim: Claim, *, trace: tracing.DeliveryTrace | None = None) -> transport.AttemptResult:
    """Prepare and send the claim's attempt on this thread, within WEBHOOK_TIMEOUT_SECONDS in all; with a
    trace, its attempt span starts before sending (adding the traceparent header) and ends with the result."""
    prepared = attempt_prepare(claim)
    if trace is not None:
        trace.attempt_started(prepared.headers)  # adds the attempt's traceparent
    if prepared.error:
        result = attempt_failed_early(prepared)
    else:
        attempt = attempt_open(transport.thread_handle(), claim, prepared)
        try:
            attempt.curl.perform()
        except pycurl.error as exc:
            result = attempt.finish(exc.args[0], str(exc.args[1]))
        else:
            result = attempt.finish()
        access_mod.after_attempt(claim.access, prepared, result)
    if trace is not None:
        trace.attempt_finished(result)
    return result


@functools.lru_cache(maxsize=4)
def _parse_schedule(text: str) -> tuple[int, ...]:
    return retry_policy.parse_schedule(text)


def _schedule() -> tuple[int, ...]:
    return _parse_schedule(settings.WEBHOOK_RETRY_SCHEDULE)  # parsed once, not on every failed attempt


def delivery_decide(*, number: int, result: transport.AttemptResult, now: datetime) -> tuple[str, datetime | None]:
    """The delivery's next state after attempt `number`: succeeded, pending until a retry, or failed."""
    if result.ok:
        return Delivery.SUCCEEDED, None
    if result.status == 410:
        return Delivery.FAILED, None
    retry_after = None
    if result.status in (429, 503):
        retry_after = retry_policy.parse_retry_after(result.retry_after, now=now)
    delay = retry_policy.next_delay(attempt_number=number, schedule=_schedule(),
                                    jitter=settings.WEBHOOK_RETRY_JITTER, retry_after=retry_after)
    if delay is None:
        return Delivery.FAILED, None
    return Delivery.PENDING, now + timedelta(seconds=delay)


@dataclass(frozen=True)
class Outcome:
    """One finished attempt, waiting to be recorded."""

    claim: Claim
    started_at: datetime
    result: transport.AttemptResult


def deliveries_record(*, outcomes: list[Outcome], hand_on: Callable[[list[str]], None] | None = None) -> list[str]:
    """Record finished attempts, move their deliveries on, update breakers, hand freed slots on.

    Successes on endpoints the claim saw healthy (nearly every attempt) are recorded together in one
    call. Anything else, and any of those whose endpoint turned out not to be healthy any more, takes
    the slow path: one transaction per attempt under the endpoint's lock that also updates the
    breaker, disables the endpoint on a 410, and records operational events (SPEC §8), except for
    deliveries of operational events. Returns each delivery's new status, in order.

    Parked deliveries given the freed slots go to `hand_on` (a worker's engine claims them itself),
    or else into the queue.
    """
    now = timezone.now()
    decided = [delivery_decide(number=o.claim.number, result=o.result, now=now) for o in outcomes]
    params = [_record_params(o, status, next_at) for o, (status, next_at) in zip(outcomes, decided)]
    # per attempt: moved on, handed on, breaker transition, endpoint class (metrics.endpoint_class)
    done: dict[int, tuple[bool, list[str], str | None, str]] = {}
    fast = [i for i, o in enumerate(outcomes) if o.result.ok and o.claim.endpoint_healthy]
    if fast:
        records = json.dumps([{**params[i], "fast": True, "hand_on": 1} for i in fast], default=str)
        rows = {row[0]: row[1:] for row in _call(_RECORD_MANY_SQL, {
            "records": records, "default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT})}
        for i in fast:
            applied, moved, handed = rows[outcomes[i].claim.delivery_id]
            if applied:
                done[i] = (moved, handed, None, metrics.HEALTHY)
    for i, outcome in enumerate(outcomes):
        if i not in done:
            token = request_id.set(outcome.claim.request_id)  # for the operational events it may record
            try:
                done[i] = _record_slow(claim=outcome.claim, result=outcome.result, status=decided[i][0], now=now,
                                       params=params[i])
            finally:
                request_id.reset(token)
    handed_on = [delivery_id for i in done for delivery_id in done[i][1]]
    if handed_on:
        if hand_on is not None:
            hand_on(handed_on)
        else:
            deliveries_enqueue(delivery_ids=handed_on, queue=settings.HERALD_PERIODIC_QUEUE, wait=True)
    for i, outcome in enumerate(outcomes):
        moved, _, transition, endpoint_class = done[i]
        claim, result = outcome.claim, outcome.result
        metrics.record_attempt(result, endpoint=endpoint_class, transition=transition)
        logger.info("delivery.attempt", extra={
            "request_id": claim.request_id, "delivery_id": claim.delivery_id, "event_id": claim.event_id,
            "endpoint_id": claim.endpoint_id, "attempt": claim.number, "response_status": result.status,
            "error": result.error, "duration_ms": result.duration_ms,
            "outcome": decided[i][0] if moved else "superseded", "probe": claim.probe, "breaker": transition})
    return [status for status, _ in decided]


def delivery_record(*, claim: Claim, started_at: datetime, result: transport.AttemptResult) -> str:
    """Record one finished attempt (see `deliveries_record`); the delivery's new status."""
    return deliveries_record(outcomes=[Outcome(claim, started_at, result)])[0]


def _record_params(outcome: Outcome, status: str, next_at: datetime | None) -> dict:
    claim, result = outcome.claim, outcome.result
    return {"id": claim.delivery_id, "number": claim.number, "started_at": outcome.started_at,
            "duration_ms": result.duration_ms, "response_status": result.status, "response_body": result.body,
            "error": result.error[:500], "status": status, "next_attempt_at": next_at, "lease_end": claim.lease_end,
            "endpoint": claim.endpoint_id, "default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT}


def _record_slow(*, claim: Claim, result: transport.AttemptResult, status: str, now: datetime,
                 params: dict) -> tuple[bool, list[str], str | None, str]:
    notify = not event_types.is_reserved(claim.event_type)
    with transaction.atomic(), connection.cursor() as cursor:
        endpoint = _lock_endpoint(cursor, params)
        change = breaker.after_attempt(
            state=endpoint.breaker, ok=result.ok, probe=claim.probe, now=now,
            threshold=settings.WEBHOOK_BREAKER_FAILURES, base=settings.WEBHOOK_BREAKER_COOLDOWN_SECONDS,
            maximum=settings.WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS)
        gone = result.status == 410
        # Our slot goes to the oldest parked delivery; a recovered endpoint's whole cap opens at once.
        if not endpoint.active or gone or change.tripped_after(endpoint.breaker):
            hand_on = 0
        else:
            hand_on = endpoint.cap if change.transition == breaker.RECOVERED else 1
        if change.fields:  # first, so that the hand-on below sees the breaker as it now is
            Endpoint.objects.filter(pk=claim.endpoint_id).update(**change.fields)
        cursor.execute(_RECORD_SQL, {**params, "fast": False, "hand_on": hand_on})
        _, moved, handed = cursor.fetchone()
        if gone and endpoint.active:
            endpoint_disable(endpoint_id=claim.endpoint_id, reason="receiver answered 410 Gone", notify=notify)
        if notify:
            _emit_operational(claim=claim, change=change, result=result, failed=moved and status == Delivery.FAILED)
    return moved, handed, change.transition, metrics.endpoint_class(failing_since=endpoint.failing_since, now=now)


def _emit_operational(*, claim: Claim, change: breaker.BreakerChange, result: transport.AttemptResult,
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


def deliveries_dispatch_due(*, batch: int | None = None) -> list[str]:
    """Beat: the relay's step (what is due and unpublished), then publish again what was lost (see
    _DISPATCH_SQL), let the probes of tripped endpoints go, and hand on the parked deliveries of
    endpoints with nothing in flight.

    A full batch is followed by another at once, for up to WEBHOOK_DISPATCH_SECONDS, so a burst of
    retries coming due goes out at the workers' pace, not one batch per beat interval.
    """
    from webhooks.relay import deliveries_relay, publish_in_batches

    try:
        backlog = broker_backlog()
    except Exception as exc:  # broker down: nothing could be published anyway; try next run
        logger.warning("dispatch.broker_unavailable", extra={"error": repr(exc)})
        return []
    batch = batch or settings.WEBHOOK_DISPATCH_BATCH
    ids = deliveries_relay(batch=batch)
    main, periodic = settings.CELERY_TASK_DEFAULT_QUEUE, settings.HERALD_PERIODIC_QUEUE
    cutoffs = _lost_cutoffs(backlog, progress.consumed_marks())
    # Re-publications go to the periodic queue (the SQL says so for every row), which workers serve in
    # turn with the main one: a backlog of fresh events cannot hold them back.
    ids += publish_in_batches(_DISPATCH_SQL, {"batch": batch, "cutoff": max(cutoffs.values()),
                                              "cutoff_main": cutoffs[main], "cutoff_periodic": cutoffs[periodic]})
    with connection.cursor() as cursor:
        cursor.execute(_WAKE_PROBES_SQL)
        woken = [row[0] for row in cursor.fetchall()]
        cursor.execute(_SWEEP_SQL, {"default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT})
        woken += [row[0] for row in cursor.fetchall()]
    deliveries_enqueue(delivery_ids=woken, queue=periodic, wait=True)
    return ids + woken


def _lost_cutoffs(backlog: dict[str, int], marks: dict[str, datetime]) -> dict[str, datetime]:
    """Per queue: an unclaimed delivery published before this is no longer waiting in it (see _DISPATCH_SQL)."""
    window = timedelta(seconds=settings.WEBHOOK_REDISPATCH_AFTER_SECONDS)
    now = timezone.now()
    never = datetime(1970, 1, 1, tzinfo=now.tzinfo)
    return {queue: now - window if not waiting else (marks[queue] - window if queue in marks else never)
            for queue, waiting in backlog.items()}


# The manual retry's rule, for one delivery or many: a finished delivery becomes pending and due now,
# with a due, unpublished outbox row (a relay publishes it at once, to the periodic queue like every
# retry). The event rows are held with KEY SHARE first: retention deletes an event with its final
# deliveries under its row lock, so it is held off (or waited for, and the delivery found gone).
_RETRY_SQL = f"""
WITH held AS (
    SELECT e.id FROM {Event._meta.db_table} e
     WHERE e.id IN (SELECT d.event_id FROM {_DELIVERY} d WHERE d.id = ANY(%(ids)s))
       FOR KEY SHARE
), retried AS (
    -- a poll endpoint's delivery is served to its consumer again, after what it was served already (a new
    -- place in the order); it is never claimed for HTTP (no next_attempt_at, no outbox row)
    UPDATE {_DELIVERY} d SET status = 'pending', parked_at = NULL, poll_seq = NULL, updated_at = %(now)s,
           next_attempt_at = CASE WHEN ep.kind = '{Endpoint.POLL}' THEN NULL ELSE %(now)s END
      FROM {_ENDPOINT} ep
     WHERE ep.id = d.endpoint_id
       AND d.id = ANY(%(ids)s) AND d.status = ANY(%(statuses)s) AND d.event_id IN (SELECT id FROM held)
       AND (%(unchanged_since)s::timestamptz IS NULL OR d.updated_at <= %(unchanged_since)s)
    RETURNING d.id, d.endpoint_id, ep.kind = '{Endpoint.POLL}' AS polled
), queued AS (
    INSERT INTO {_OUTBOX} AS o (delivery_id, due_at, published_at, periodic)
    SELECT id, %(now)s, NULL, true FROM retried WHERE NOT polled
    ON CONFLICT (delivery_id) DO UPDATE SET due_at = excluded.due_at, published_at = NULL, periodic = true
)
SELECT id, endpoint_id, polled FROM retried
"""
RETRYABLE = (Delivery.FAILED, Delivery.SUCCEEDED)


def deliveries_retry(*, delivery_ids: list[str], now: datetime, statuses: tuple[str, ...] = RETRYABLE,
                     unchanged_since: datetime | None = None) -> list[str]:
    """Manual retry of many deliveries, in the caller's transaction: each one whose status is in `statuses`
    (and, with `unchanged_since`, not changed after it) becomes pending, due at `now`, and is published
    after commit (see _RETRY_SQL); any other is left be.
    Returns the ids it retried. The one owner of the rule: a single retry and a recovery both use it."""
    if not delivery_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_RETRY_SQL, {"ids": list(delivery_ids), "now": now, "statuses": list(statuses),
                                    "unchanged_since": unchanged_since})
        rows = cursor.fetchall()
    if any(not polled for _, _, polled in rows):
        transaction.on_commit(publisher.ring, robust=True)
    polled = [endpoint_id for _, endpoint_id, polled in rows if polled]
    if polled:
        poll_notify(endpoint_ids=polled)
    return [delivery_id for delivery_id, _, _ in rows]


@transaction.atomic
def delivery_retry(*, delivery: Delivery) -> Delivery:
    """Manual retry: a finished delivery becomes pending and due now (see `deliveries_retry`; a poll
    endpoint's is served to its consumer again); a pending one is left be. Delivery.DoesNotExist if
    retention deleted it meanwhile."""
    deliveries_retry(delivery_ids=[delivery.pk], now=timezone.now())
    delivery.refresh_from_db()
    return delivery


def endpoints_disable_failing(*, now: datetime | None = None) -> int:
    """Disable endpoints that have failed continuously for WEBHOOK_DISABLE_AFTER_SECONDS."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS)
    failing = Endpoint.objects.filter(enabled=True, deleted_at__isnull=True, failing_since__lte=cutoff)
    return sum(endpoint_disable(endpoint_id=endpoint_id, reason="failing continuously")
               for endpoint_id in failing.values_list("id", flat=True))
