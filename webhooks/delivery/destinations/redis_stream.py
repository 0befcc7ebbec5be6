"""The `redis_stream` destination (SPEC §14): `XADD` of each message to a stream of the tenant's Redis, on redis-py.

Fields: `url` (`redis://[user:pass@]host:6379/0`, or `rediss://`), `stream`, `maxlen` (optional: `XADD ... MAXLEN
~ N`, the stream trimmed to about N entries). The entry's fields are `webhook-id`, `webhook-timestamp`,
`webhook-signature`, `content-type` and `body` (the webhook's bytes). Success is the entry's id; an error reply
(a key of another type, an out-of-memory refusal) or a connection error is a failed attempt. A batch is one
pipeline: one round trip.
"""
from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from webhooks.delivery.destinations import brokers

kind = "redis_stream"
ports = {"redis": 6379, "rediss": 6380}
fields = ("stream", "maxlen")
MAXLEN_MAX = 10_000_000


def options_validate(given: dict, current: dict | None) -> dict:
    merged = {**(current or {}), **given}
    stream = brokers.name_validate(merged, "stream", required=True, limit=512)
    maxlen = merged.get("maxlen")
    if maxlen is not None and (isinstance(maxlen, bool) or not isinstance(maxlen, int)
                               or not 1 <= maxlen <= MAXLEN_MAX):
        raise brokers.DestinationRefused("maxlen", f"null, or a whole number from 1 to {MAXLEN_MAX}.")
    return {"stream": stream, "maxlen": maxlen}


def _db(path: str) -> int:
    text = path.strip("/") or "0"
    if not text.isdigit():
        raise ValueError(f"invalid_url: the database {text!r} is not a number")
    return int(text)


class _Connection:
    def __init__(self, target: brokers.Target, address: str, timeout: float) -> None:
        parts = target.parts
        user, password = brokers.credentials(target)
        tls = parts.scheme == "rediss"
        # TLS checks the certificate against the URL's host name, so it connects by that name (after the check
        # of its addresses); plain TCP connects to the address that was checked.
        self._client = redis.Redis(
            host=parts.hostname if tls else address, port=parts.port or ports[parts.scheme], db=_db(parts.path),
            username=user, password=password, socket_timeout=timeout, socket_connect_timeout=timeout, ssl=tls,
            single_connection_client=True, retry=Retry(NoBackoff(), 0))  # a failed attempt is retried by the schedule
        self._client.ping()
        self._stream, self._maxlen = target.options["stream"], target.options.get("maxlen")

    def publish(self, messages: list[brokers.Message], deadline: float) -> list[str | Exception]:
        pipe = self._client.pipeline(transaction=False)
        for message in messages:
            entry = {name: message.headers[name] for name in brokers.MESSAGE_HEADERS if name in message.headers}
            entry["body"] = message.body
            pipe.xadd(self._stream, entry, maxlen=self._maxlen, approximate=True)
        answers = pipe.execute(raise_on_error=False)
        return [RuntimeError(f"redis_error: {answer}") if isinstance(answer, Exception)
                else f"entry {answer.decode() if isinstance(answer, bytes) else answer}" for answer in answers]

    def close(self) -> None:
        self._client.close()


def connect(target: brokers.Target, address: str, timeout: float) -> _Connection:
    return _Connection(target, address, timeout)


classify = brokers.classify  # delivered or not: a broker is never gone for good, and sets no Retry-After
