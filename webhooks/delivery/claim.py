"""The claim: the leases of due deliveries taken in one call, each with what its attempt needs (a Claim).

What may be claimed, and when a delivery is parked instead, is `herald_delivery_claim`
(webhooks/sql/delivery_claim.sql, through herald_delivery_claim_many); the lease it takes is
webhooks/delivery/leases.py's table. Each claim carries its endpoint's destination (its kind, and for a
broker its target: webhooks/delivery/destinations/) and access, read in the same statement.
"""
import logging
from dataclasses import dataclass
from datetime import datetime

from webhooks import crypto
from webhooks.conf import herald_settings
from webhooks.delivery import db, leases
from webhooks.delivery.destinations import access as access_mod
from webhooks.delivery.destinations import brokers
from webhooks.models import Endpoint

logger = logging.getLogger("herald.delivery")

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


# The claimed endpoints this worker holds secrets of that are still live, with their access's version
# (access_mod.caches_check_due / caches_forget: what a deleted endpoint or tenant left is dropped).
_LIVE_SQL = f"""
SELECT e.id, a.updated_at FROM {Endpoint._meta.db_table} e LEFT JOIN {access_mod.ACCESS_TABLE} a ON a.endpoint_id = e.id
 WHERE e.id = ANY(%(ids)s) AND e.deleted_at IS NULL
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
    url: str  # the endpoint's URL as shown (a broker's without its credentials: its target has them)
    secrets: list[str]
    probe: bool
    endpoint_healthy: bool  # as the claim saw it: not tripped, no failure counted
    access: access_mod.Access | None = None  # extra headers, auth, client certificate (SPEC §11), a broker's target

    @property
    def kind(self) -> str:
        """The destination's kind (webhooks/delivery/destinations/): http unless its access names a broker."""
        target = self.access.target if self.access is not None else None
        return target.kind if target is not None else Endpoint.HTTP


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
    return claims_from_rows(db.call(_CLAIM_MANY_SQL, _params(delivery_ids)))


def _params(delivery_ids: list[str]) -> dict:
    return db.endpoint_params(ids=list(dict.fromkeys(delivery_ids)),
                              lease=herald_settings.delivery.WEBHOOK_LEASE_SECONDS)


def claim_rows(cursor, delivery_ids: list[str]) -> list[tuple]:
    """The claim of `deliveries_claim` in the caller's transaction (a record's, which claims the deliveries it
    handed its freed slots to before its endpoints' locks go, so that no other claim takes those slots first);
    `claims_from_rows` reads its rows once that transaction has committed."""
    cursor.execute(_CLAIM_MANY_SQL, _params(delivery_ids))
    return cursor.fetchall()


def claims_from_rows(rows: list[tuple]) -> Claims:
    """What a claim's rows got (see `deliveries_claim`)."""
    leases.window_freed.set()
    claims, wake_at = {}, {}
    width = len(access_mod.ACCESS_COLUMNS.split(","))
    access_rows = [(row[8], *row[-width + 1:]) for row in rows if row[-width]]
    asked = access_mod.caches_check_due([row[8] for row in rows if row[1]], [row[:2] for row in access_rows])
    if asked:
        live = dict(db.call(_LIVE_SQL, {"ids": asked}))
        access_mod.caches_forget(live)
        brokers.pools_keep_only(live)  # a deleted or changed broker endpoint's connections are closed
    found, broken = access_mod.access_from_rows(access_rows)
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
        if wake is not None:  # the throttle only moves on: the batch's latest time is the endpoint's
            wake_at[endpoint_id] = max(wake, wake_at.get(endpoint_id, wake))
    return Claims(claims, wake_at)


def delivery_claim(*, delivery_id: str) -> Claim | None:
    """One delivery's claim (see `deliveries_claim`)."""
    return deliveries_claim(delivery_ids=[delivery_id]).claims.get(delivery_id)
