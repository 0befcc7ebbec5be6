"""The lease (DeliveryLease): a claim takes it, so that no delivery is ever sent twice at once.

The claim is `herald_delivery_claim` (webhooks/sql/delivery_claim.sql): under the endpoint's row lock
it counts the live leases against the endpoint's cap and reads its breaker, ordering and throttle; a
delivery that may not go now is *parked*: no attempt, no retry step, no worker held. The record
(webhooks/delivery/attempts.py) releases the lease; beat's dispatcher deletes the leases whose worker
died (`DELETE_EXPIRED_SQL`), retention those of what it deletes (`delete_of`).
"""
import logging
from dataclasses import dataclass
from datetime import datetime

from webhooks import access as access_mod
from webhooks import crypto
from webhooks.conf import herald_settings
from webhooks.delivery import db
from webhooks.models import DeliveryLease

logger = logging.getLogger("herald.delivery")

TABLE = DeliveryLease._meta.db_table

DELETE_EXPIRED_SQL = f"DELETE FROM {TABLE} WHERE until <= now()"


def delete_of(column: str, ids: str) -> str:
    """A part of a statement: the leases whose `column` (delivery_id or endpoint_id) is in `ids` (a SELECT)
    go; RETURNING 1 each."""
    return f"DELETE FROM {TABLE} l WHERE l.{column} IN ({ids}) RETURNING 1"


# The functions are defined, and their rules explained, in webhooks/sql/ (one file each).
# Each claimed delivery comes with its endpoint's access (headers, auth, client certificate; NULLs for an
# endpoint without any) in the same statement, so that access costs no round trip of its own.
_CLAIM_MANY_SQL = f"""
SELECT c.*, {access_mod.ACCESS_COLUMNS}
  FROM herald_delivery_claim_many(%(ids)s, %(lease)s, %(default_cap)s) c
  LEFT JOIN {access_mod.ACCESS_TABLE} a ON c.go AND a.endpoint_id = c.endpoint_id
"""


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
    rows = db.call(_CLAIM_MANY_SQL, db.endpoint_params(ids=list(dict.fromkeys(delivery_ids)),
                                                       lease=herald_settings.delivery.WEBHOOK_LEASE_SECONDS))
    claims, wake_at = {}, {}
    width = len(access_mod.ACCESS_COLUMNS.split(","))
    found, broken = access_mod.access_from_rows([(row[8], *row[-width + 1:]) for row in rows if row[-width]])
    for row in rows:
        (delivery_id, claimed, number, lease_end, event_id, event_type, payload, req_id, endpoint_id, tenant_id, url,
         tripped, healthy, secrets, wake) = row[:-width]  # `claimed`: the function's `go` column
        if claimed:
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
