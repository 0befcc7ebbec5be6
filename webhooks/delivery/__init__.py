"""The delivery wing: one owner module per table it writes, the claim, the attempt's parts, the record, the
engine, and the destinations.

Table owners (every write of the table from Python goes through its owner, whole or as a part of a statement;
each owner's docstring names every writer, the PL/pgSQL functions of webhooks/sql/ among them):
- deliveries (Delivery): `deliveries`; endpoints (Endpoint): `endpoints` (with the breaker's and disable's
  writes, and an endpoint disabled's operational event);
- the outbox (DeliveryOutbox): `outbox`; the lease (DeliveryLease): `leases`; the attempt record
  (DeliveryAttempt, and the delivery moved on after an attempt): `attempts`;
- events and their deliveries inserted together at intake, and Herald's own operational events: `fanout`;
- parked deliveries handed on (the calls of herald_endpoint_hand_on, at most HAND_ON_LIMIT at once): `parked`;
- the manual retry (a finished delivery pending again, with its outbox row): `retries`.

One attempt, in order: `claim` (the lease taken, with what the attempt needs: a Claim, carrying its endpoint's
destination), `sending` (its signed headers, then its destination's request), `destinations/` (one module per
kind behind one protocol: prepare, send, classify; http and poll, and the brokers of SPEC §14), `record`
(what the result means, the attempt recorded, the breaker, a gone destination's endpoint disabled, the
operational events), and `engine` (a worker's loop over all of it: libcurl's multi handle for HTTP, the broker
threads for the brokers; `pacing`, its clocks for throttled endpoints). The pure parts beside them: `signing`, `breaker`, `retry_policy`, `addresses` (the
SSRF policy), `metrics`.

Around them: `relay` (publishes what the outbox has due, as `scheduling` chooses: fair shares across tenants
within the publish window), `dispatcher` (beat's sweeps), `publishing` (the Celery broker, the relays'
doorbell and poll endpoints' long-polls), `db` (a claim or record on the worker's pool; the one place the
deployment's default cap goes into SQL). The services above (webhooks/services/) write these tables only
through the owners here; nothing here calls a service (pyproject.toml's import contracts hold it).
"""
