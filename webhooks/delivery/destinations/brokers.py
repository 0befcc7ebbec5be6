"""What the message-broker destinations share: their target, a bounded pool of connections per endpoint, the
SSRF policy on the broker's host, one batch of attempts, and the worker's threads that send them.

A broker kind (amqp.py, redis_stream.py, nats.py) says which URL schemes and fields it takes and how to open a
connection and publish a batch on it (`BrokerKind`); everything else is here, the same for each:

- `send` takes a connection from the endpoint's pool (`Pool`: at most POOL_SIZE, reused across attempts), opening
  one if need be to an address the SSRF policy allows (webhooks/delivery/addresses.py; the host is resolved here
  and the connection made to the address checked, so a DNS answer cannot change between the check and the
  connect), publishes the batch within the attempts' deadline, and returns one AttemptResult per message, in
  order. It never raises for a failed attempt: a refused connection, a timeout, a nack or a returned message is
  a result with its `error`. A connection that failed is closed, not reused.
- A pool lives as long as its endpoint's access row as it was: `pools_keep_only` (called by the claim with
  what is live) closes the connections of an endpoint deleted, or whose URL or fields changed.
- `Sender` sends the engine's batches on BROKER_THREADS threads, one tenant's at most BROKER_PER_TENANT at once:
  a tenant whose broker hangs holds only its own share, each batch for at most its deadline, and the engine
  thread never waits on a broker.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from webhooks.delivery import addresses
from webhooks.delivery.destinations.base import AttemptResult, Verdict

logger = logging.getLogger("herald.brokers")

POOL_SIZE = 4  # connections to one endpoint's broker at most, per worker process
BROKER_THREADS = 8
BROKER_PER_TENANT = 2
_MAX_ERROR_CHARS = 200

# The Standard Webhooks headers a message carries (SPEC §14): what an HTTP attempt signs, without HTTP's own.
MESSAGE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature", "content-type")


class DestinationRefused(ValueError):
    """What the tenant sent for `field` cannot be used for this kind (a 400 naming the field)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Target:
    """A broker endpoint as its attempts use it: its kind, its URL with credentials (never shown), its fields,
    and `key`, the version of its access row its connections belong to."""

    kind: str
    url: str = field(repr=False)
    options: dict = field(default_factory=dict)
    key: tuple = ()

    @property
    def parts(self):
        return urlsplit(self.url)


@dataclass(frozen=True)
class Message:
    """One attempt's message: its delivery, the signed headers (MESSAGE_HEADERS) and the webhook's bytes."""

    delivery_id: str
    headers: dict[str, str]
    body: bytes


class Connection(Protocol):
    def publish(self, messages: list[Message], deadline: float) -> list[str | Exception]:
        """Publish the messages; per message the broker's answer (a confirm, an entry id, an ack) or the error
        that failed it. Raises for what breaks the connection (every unanswered message failed)."""

    def close(self) -> None: ...


class BrokerKind(Protocol):
    kind: str
    ports: dict[str, int]  # URL schemes and their default ports
    fields: tuple[str, ...]  # the kind's own fields, beside `url`

    def options_validate(self, given: dict, current: dict | None) -> dict: ...

    def connect(self, target: Target, address: str, timeout: float) -> Connection: ...


def url_without_credentials(url: str) -> str:
    """The URL as the endpoint shows it: no user name or password."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def credentials(target: Target) -> tuple[str | None, str | None]:
    parts = target.parts
    return (unquote(parts.username) if parts.username else None, unquote(parts.password) if parts.password else None)


def url_validate(kind: BrokerKind, url: Any) -> str:
    """The broker URL, checked: a string of the kind's schemes with a host (the SSRF check is the caller's)."""
    if not isinstance(url, str) or not url or len(url) > 2000 or any(ord(c) < 0x21 or ord(c) == 0x7f for c in url):
        raise DestinationRefused("url", "Must be a URL of at most 2000 characters, without spaces.")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise DestinationRefused("url", f"Not a valid URL: {exc}.") from None
    if parts.scheme not in kind.ports:
        raise DestinationRefused("url", f"A {kind.kind} endpoint's URL must use {' or '.join(kind.ports)}.")
    if not host:
        raise DestinationRefused("url", "The URL has no host.")
    del port
    if parts.query or parts.fragment:
        raise DestinationRefused("url", "The URL takes no query or fragment.")
    return url


def name_validate(given: dict, name: str, *, required: bool, limit: int = 255, pattern=None) -> str | None:
    value = given.get(name)
    if value is None:
        if required:
            raise DestinationRefused(name, "This field is required.")
        return None
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable() or (
            pattern is not None and not pattern.fullmatch(value)):
        raise DestinationRefused(name, f"Must be a non-empty string of at most {limit} printable characters"
                                       + (" of the kind's alphabet." if pattern is not None else "."))
    return value


# -- connections --------------------------------------------------------------------------------------


def _address(kind: BrokerKind, target: Target, timeout: float, allow_private: bool) -> str:
    """An address of the broker's host that the SSRF policy allows (raises ValueError if none)."""
    parts = target.parts
    addresses_found = addresses.resolve(parts.hostname, parts.port or kind.ports[parts.scheme], timeout)
    allowed = [ip for ip in addresses_found if allow_private or addresses.is_public_address(ip)]
    if not allowed:
        raise PermissionError(f"blocked_address: {addresses_found[0] if addresses_found else parts.hostname} "
                              "is not a public address")
    return allowed[0]


class Pool:
    """At most POOL_SIZE connections to one endpoint's broker, reused across attempts."""

    def __init__(self, kind: BrokerKind, target: Target) -> None:
        self.kind, self.target = kind, target
        self._idle: list[Connection] = []
        self._open = 0
        self._closed = False
        self._changed = threading.Condition()

    def acquire(self, deadline: float, allow_private: bool) -> Connection:
        with self._changed:
            while not self._idle and self._open >= POOL_SIZE:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("timeout: no connection to the broker came free within the deadline")
                self._changed.wait(remaining)
            if self._idle:
                return self._idle.pop()
            self._open += 1
        try:
            remaining = max(deadline - time.monotonic(), 0.001)
            address = _address(self.kind, self.target, remaining, allow_private)
            return self.kind.connect(self.target, address, max(deadline - time.monotonic(), 0.001))
        except BaseException:
            self._gone()
            raise

    def release(self, connection: Connection, *, broken: bool) -> None:
        if broken or self._closed:
            _close(connection)
            self._gone()
            return
        with self._changed:
            self._idle.append(connection)
            self._changed.notify()

    def _gone(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            _close(connection)
            self._gone()


def _close(connection: Connection) -> None:
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - a connection that will not close cleanly is dropped all the same
        logger.debug("brokers.close_failed", exc_info=True)


_pools: dict[tuple, Pool] = {}
_pools_lock = threading.Lock()


def _pool(kind: BrokerKind, target: Target) -> Pool:
    with _pools_lock:
        pool = _pools.get(target.key)
        if pool is None:
            pool = _pools[target.key] = Pool(kind, target)
        return pool


def pools_keep_only(live: dict[str, Any]) -> int:
    """Close the pools of endpoints not in `live` (endpoint id -> its access row's version), and of older
    versions of those that are; the number closed."""
    with _pools_lock:
        stale = [key for key in _pools if live.get(key[0], "gone") != key[1]]
        pools = [_pools.pop(key) for key in stale]
    for pool in pools:
        pool.close()
    return len(pools)


def pools_close() -> None:
    """Close every pool of this process (a test's teardown, a worker shutting down)."""
    pools_keep_only({})


def pools_open() -> dict[tuple, int]:
    """The connections each pool holds open now (tests, the bench)."""
    with _pools_lock:
        return {key: pool._open for key, pool in _pools.items()}


def _describe(exc: BaseException, timeout: float) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, PermissionError) and text.startswith("blocked_address"):
        return text[:_MAX_ERROR_CHARS]
    if isinstance(exc, TimeoutError) or "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return (text if text.startswith("timeout") else f"timeout: deadline of {timeout:g}s exceeded ({text})")[
            :_MAX_ERROR_CHARS]
    return f"connection_error: {type(exc).__name__}: {text}"[:_MAX_ERROR_CHARS]


def send(kind: BrokerKind, target: Target, messages: list[Message], *, timeout: float,
         allow_private: bool) -> list[AttemptResult]:
    """One batch of attempts to the broker, within `timeout` in all; a result per message, in order."""
    started = time.monotonic()
    deadline = started + timeout
    pool = _pool(kind, target)
    connection = None
    try:
        connection = pool.acquire(deadline, allow_private)
        answers = connection.publish(messages, deadline)
    except Exception as exc:  # noqa: BLE001 - every message of the batch is a failed attempt
        if connection is not None:
            pool.release(connection, broken=True)
        error = _describe(exc, timeout)
        spent = int((time.monotonic() - started) * 1000)
        return [AttemptResult(status=None, body="", duration_ms=spent, error=error, retry_after=None)
                for _ in messages]
    spent = int((time.monotonic() - started) * 1000)
    pool.release(connection, broken=False)
    results = []
    for answer in answers:
        if isinstance(answer, Exception):
            results.append(AttemptResult(status=None, body="", duration_ms=spent, error=str(answer)[:_MAX_ERROR_CHARS]
                                         or type(answer).__name__, retry_after=None))
        else:
            results.append(AttemptResult(status=None, body=answer[:4096], duration_ms=spent, error="",
                                         retry_after=None, accepted=True))
    return results


def classify(result: AttemptResult) -> Verdict:
    """A broker's answer: delivered or not; a broker is never gone for good and sets no Retry-After."""
    return Verdict(ok=result.ok)


# -- the worker's threads -----------------------------------------------------------------------------


@dataclass
class Batch:
    """Attempts of one endpoint to send together: `context` is the caller's (the engine's claims)."""

    tenant_id: str
    kind: BrokerKind
    target: Target
    messages: list[Message]
    context: Any
    ready: Callable[[], bool] = lambda: True  # False: give it up unsent (its leases would run out first)


class Sender:
    """Sends batches on BROKER_THREADS threads, a tenant's at most BROKER_PER_TENANT at once (its others wait,
    in order); `done(batch, results, started_at_monotonic)` is called with each batch's results, or with None
    for one given up."""

    def __init__(self, done: Callable[[Batch, list[AttemptResult] | None], None], *, timeout: Callable[[], float],
                 allow_private: Callable[[], bool]) -> None:
        self._done, self._timeout, self._allow_private = done, timeout, allow_private
        self._threads = ThreadPoolExecutor(max_workers=BROKER_THREADS, thread_name_prefix="herald-broker")
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[Batch]] = {}

    def submit(self, batch: Batch) -> None:
        with self._lock:
            if self._running.get(batch.tenant_id, 0) >= BROKER_PER_TENANT:
                self._waiting.setdefault(batch.tenant_id, deque()).append(batch)
                return
            self._running[batch.tenant_id] = self._running.get(batch.tenant_id, 0) + 1
        self._threads.submit(self._run, batch)

    def _run(self, batch: Batch | None) -> None:
        while batch is not None:
            results = None
            try:
                if batch.ready():
                    results = send(batch.kind, batch.target, batch.messages, timeout=self._timeout(),
                                   allow_private=self._allow_private())
                else:
                    logger.warning("brokers.batch_given_up", extra={"tenant_id": batch.tenant_id,
                                                                     "messages": len(batch.messages)})
            except Exception:  # noqa: BLE001 - unsent: the leases run out and beat sends them again
                logger.exception("brokers.batch_failed")
            try:
                self._done(batch, results)
            except Exception:  # noqa: BLE001
                logger.exception("brokers.done_failed")
            batch = self._next(batch.tenant_id)

    def _next(self, tenant_id: str) -> Batch | None:
        with self._lock:
            waiting = self._waiting.get(tenant_id)
            if waiting:
                batch = waiting.popleft()
                if not waiting:
                    del self._waiting[tenant_id]
                return batch
            self._running[tenant_id] -= 1
            if not self._running[tenant_id]:
                del self._running[tenant_id]
            return None

    def stop(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
