"""The delivery core's table owners: each table the delivery path writes has one module here.

- the outbox (DeliveryOutbox): `outbox` (every write of it from Python, whole or as part of a statement);
- the lease (DeliveryLease): `leases` (the claim takes it);
- the attempt record (DeliveryAttempt, and the delivery moved on after an attempt): `attempts` (also the parts
  of retention's, erasure's and a poll acknowledgement's statements that write attempts);
- parked deliveries handed on (the calls of herald_endpoint_hand_on, at most HAND_ON_LIMIT at once): `parked`;
- the manual retry (a finished delivery pending again, with its outbox row): `retries`.

Their callers here: `relay` (publishes what the outbox has due), `dispatcher` (beat's sweeps), and
`sending` (one attempt's request). `publishing` talks to the broker, the relays' doorbell and poll
endpoints' long-polls; `db` runs a claim or record on the worker's pool and is the one place the
deployment's default cap goes into SQL. The PL/pgSQL functions they call are webhooks/sql/, one file each.

Above this package: the services (intake's fan-out, endpoints, retention, ...) write these tables only
through it; webhooks/recording.py records attempts and what follows them (breaker, 410, operational
events); webhooks/engine.py claims, sends and records a worker's attempts.
"""
