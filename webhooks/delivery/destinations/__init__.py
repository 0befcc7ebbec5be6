"""The destinations: one module per kind of endpoint, behind one small protocol (base.py), registered in kinds.py.

- `http` (http.py on libcurl: http_transport.py, with access.py's headers, auth and certificates) and `poll`
  (poll.py: never sent, read by its consumer);
- the message brokers of SPEC §14, on brokers.py's pools, SSRF check and threads: `amqp` (amqp.py),
  `redis_stream` (redis_stream.py) and `nats` (nats.py).

Adding a kind is one module (its `kind`, URL `ports`, `fields`, `options_validate`, `connect` for a broker),
its line in kinds.py and its name in Endpoint.KINDS (docs/design.md, "Adding a destination"). This file
imports nothing, so that libcurl's transport stays importable without Django (a probe of tests/test_transport.py).
"""
