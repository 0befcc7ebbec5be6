"""The attempt record (DeliveryAttempt): `herald_delivery_record` (webhooks/sql/delivery_record.sql) writes it.

Under the endpoint's row lock the record inserts the attempt, releases the lease, moves the delivery on
(succeeded, failed, or pending until its retry, with the retry's outbox row) and hands the freed slot to
the oldest parked delivery. Two ways in: many successes on endpoints the claim saw healthy in one call
(`record_healthy_successes`), or the rest together in a transaction that holds their endpoints' locks
already (`lock_endpoints`, then `record_locked`). What decides between them, and the breaker and operational
events around the second, is webhooks/delivery/record.py. Attempts go with their deliveries (`delete_of`, a part of
retention's and erasure's statements); a poll endpoint's acknowledgement is an attempt too
(`insert_acknowledged`, in webhooks/services/polling.py's statement).
"""
import functools
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from webhooks.conf import herald_settings
from webhooks.delivery import breaker, db, deliveries, retry_policy
from webhooks.delivery.claim import Claim
from webhooks.delivery.destinations.base import AttemptResult, Verdict
from webhooks.models import Delivery, DeliveryAttempt, Endpoint

TABLE = DeliveryAttempt._meta.db_table



def insert_acknowledged(source: str) -> str:
    """A part of a statement: a poll endpoint's acknowledgement recorded as the attempt of each row of `source`
    (`id`, `attempt_count`: the delivery, its number already counted), succeeded at once, with no HTTP status."""
    return f"""INSERT INTO {TABLE} (delivery_id, number, started_at, duration_ms, response_status, response_body,
                            error, created_at)
    SELECT id, attempt_count, now(), 0, NULL, '', '', now() FROM {source}"""


def delete_of_events(events: str) -> str:
    """A part of a statement: the attempts of every delivery of `events` (an array of event ids) go; RETURNING 1
    each. Retention's form: a join. `delete_of`'s array deleted 2.5x faster in the black-box year scenario (one
    run each, 2026-12-01) but took so much more of the CPU while it worked that intake's p99 beside it tripled."""
    bounds = f"SELECT unnest(CAST({events} AS varchar[]))"
    return f"""DELETE FROM {TABLE} a USING {Delivery._meta.db_table} d
     WHERE a.delivery_id = d.id AND d.event_id = ANY({events})
       AND {deliveries.of_events_bounds('d.id', bounds)} AND {deliveries.of_events_bounds('a.delivery_id', bounds)}
    RETURNING 1"""


def delete_of(deliveries: str) -> str:
    """A part of a statement: the attempts of `deliveries` (an array of delivery ids, e.g. `ARRAY(SELECT ...)`)
    go; RETURNING 1 each. An array, not `IN (SELECT ...)`: the attempts are the largest table, and an array of
    ids is looked up on the delivery_id index whatever the planner guesses of the SELECT's size."""
    # its bounds: PostgreSQL reads only the days those deliveries lie in (the table is partitioned by delivery_id)
    return (f"DELETE FROM {TABLE} a WHERE a.delivery_id = ANY({deliveries}) "
            f"AND a.delivery_id >= (SELECT min(b) FROM unnest({deliveries}) b) "
            f"AND a.delivery_id <= (SELECT max(b) FROM unnest({deliveries}) b) RETURNING 1")


# The endpoints' rows, locked in id order (as every batch locks them: batches never deadlock), with what the
# record's slow path decides on (in its own transaction).
_LOCK_ENDPOINTS_SQL = f"""
SELECT ep.id, ep.tenant_id, ep.url, ep.enabled AND ep.deleted_at IS NULL, ep.deleted_at IS NOT NULL,
       herald_endpoint_cap(ep.ordering, ep.max_in_flight, %(default_cap)s), ep.tripped_at, ep.next_probe_at <= now(),
       ep.consecutive_failures, ep.failed_probes, ep.failing_since
  FROM {Endpoint._meta.db_table} ep
 WHERE ep.id = ANY(%(endpoints)s)
 ORDER BY ep.id
   FOR NO KEY UPDATE
"""
_RECORD_MANY_SQL = "SELECT * FROM herald_delivery_record_many(%(records)s::jsonb, %(default_cap)s)"


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
class Outcome:
    """One finished attempt, waiting to be recorded."""

    claim: Claim
    started_at: datetime
    result: AttemptResult


@functools.lru_cache(maxsize=4)
def _parse_schedule(text: str) -> tuple[int, ...]:
    return retry_policy.parse_schedule(text)


def _schedule() -> tuple[int, ...]:
    return _parse_schedule(herald_settings.delivery.WEBHOOK_RETRY_SCHEDULE)  # parsed once, not on every failed attempt


def delivery_decide(*, number: int, verdict: Verdict, now: datetime) -> tuple[str, datetime | None]:
    """The delivery's next state after attempt `number`, by its destination's verdict on the result
    (webhooks/delivery/destinations/): succeeded, failed at once (gone), pending until a retry (not before a
    Retry-After the destination was given, within the schedule's longest step), or failed after the last."""
    if verdict.ok:
        return Delivery.SUCCEEDED, None
    if verdict.gone:
        return Delivery.FAILED, None
    retry_after = None
    if verdict.retry_after is not None:
        retry_after = retry_policy.parse_retry_after(verdict.retry_after, now=now)
    delay = retry_policy.next_delay(attempt_number=number, schedule=_schedule(),
                                    jitter=herald_settings.delivery.WEBHOOK_RETRY_JITTER, retry_after=retry_after)
    if delay is None:
        return Delivery.FAILED, None
    return Delivery.PENDING, now + timedelta(seconds=delay)


def record_params(outcome: Outcome, status: str, next_at: datetime | None) -> dict:
    """What the record of one attempt is called with (but the path it takes and the slots it hands on)."""
    claim, result = outcome.claim, outcome.result
    return db.endpoint_params(
        id=claim.delivery_id, number=claim.number, started_at=outcome.started_at, duration_ms=result.duration_ms,
        response_status=result.status, response_body=result.body, error=result.error[:500], status=status,
        next_attempt_at=next_at, lease_end=claim.lease_end, endpoint=claim.endpoint_id)


def record_healthy_successes(params: list[dict],
                             then=None) -> tuple[dict[str, tuple[bool, bool, list[str]]], object]:
    """Record successes on endpoints the claim saw healthy, in one call of its own; by delivery id: whether
    it was recorded (the endpoint was still healthy under its lock; if not, nothing was written and the slow
    path records it), whether the delivery moved on, and the parked deliveries handed the freed slot.
    (The function's `fast` and `hand_on` keys: the healthy-success path, and one slot to hand on.) With
    `then`, `then(cursor, {handed id: the recorded delivery's id})` runs in the same transaction, and what it
    returns is returned beside; it claims the handed-on deliveries (`claim`, see
    webhooks/sql/endpoint_hand_on.sql)."""
    records = json.dumps([{**p, "fast": True, "hand_on": 1, "claim": then is not None} for p in params], default=str)
    sql, sql_params = _RECORD_MANY_SQL, db.endpoint_params(records=records)
    if then is None:
        return {row[0]: row[1:] for row in db.call(sql, sql_params)}, None
    rows, extra = db.call_then(sql, sql_params, lambda cursor, rows: then(
        cursor, {handed: row[0] for row in rows if row[1] for handed in row[3]}))
    return {row[0]: row[1:] for row in rows}, extra


def lock_endpoints(cursor, endpoint_ids: list[str]) -> dict[str, EndpointState]:
    """The endpoints' rows, under their locks (taken in id order), in the caller's transaction."""
    cursor.execute(_LOCK_ENDPOINTS_SQL, db.endpoint_params(endpoints=sorted(set(endpoint_ids))))
    return {row[0]: EndpointState(*row) for row in cursor.fetchall()}


def record_locked(cursor, records: list[tuple[dict, int]], *,
                  claiming: bool = False) -> dict[str, tuple[bool, list[str]]]:
    """Record attempts ((params, slots to hand on) each) in one call, in the caller's transaction, which holds
    their endpoints' locks (`lock_endpoints`); after each, up to its slots of parked deliveries take the room its
    endpoint has then. By delivery id: whether the delivery moved on, and those handed on. `claiming`: the
    caller claims the handed-on deliveries in this transaction (as with `record_healthy_successes`' `then`)."""
    payload = json.dumps([{**params, "fast": False, "hand_on": slots, "claim": claiming} for params, slots in records],
                         default=str)
    cursor.execute(_RECORD_MANY_SQL, db.endpoint_params(records=payload))
    return {row[0]: (row[2], row[3]) for row in cursor.fetchall()}
