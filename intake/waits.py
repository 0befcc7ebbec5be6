"""Long-polls waiting at once, capped per credential and per poll endpoint (SPEC §1 `POLL_MAX_WAITS_*`).

Each waiting long-poll holds one entry in two sorted sets in Redis (the credential's and the endpoint's),
so every web process on every host counts the same waits. An entry's score is when it expires: the
poll's deadline plus EXPIRY_MARGIN_SECONDS. A poll that answers, or whose client hangs up, removes its
entries at once (`release`); a process that dies without doing so leaves entries that stop counting
when they expire, at most POLL_MAX_WAIT_SECONDS + EXPIRY_MARGIN_SECONDS later, and the sets themselves
expire when no wait is left in them. One Lua script, under Redis's clock, drops the expired entries,
checks both caps and adds the entries, so two processes can never both take the last place.

A wait over a cap is answered 429 `too_many_waits` at once, with `Retry-After`: when the oldest wait in
the full set ends at the latest. If Redis cannot be reached the caps are not applied (as
INTAKE_RATE_LIMIT_PER_SECOND: answering matters more than the cap; the web worker's own bounds still
hold) and the log says so, once per LOG_EVERY_SECONDS.
"""
from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from intake.metrics import polls_refused
from webhooks.conf import herald_settings

logger = logging.getLogger("herald.waits")

KEY_PREFIX = "herald:waits:"
EXPIRY_MARGIN_SECONDS = 5.0
REDIS_TIMEOUT_SECONDS = 0.25
RETRY_AFTER_FAILURE_SECONDS = 1.0
LOG_EVERY_SECONDS = 10.0

# KEYS: the credential's set, the endpoint's set. ARGV: the entry, how long it holds (ms), the credential's
# cap, the endpoint's cap, how long a set may live (ms). Returns {0, 0} when the entry was added, else
# {1 or 2 (which cap), ms until the oldest entry of that set expires}.
TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local caps = {tonumber(ARGV[3]), tonumber(ARGV[4])}
for i = 1, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZCARD', KEYS[i]) >= caps[i] then
    local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    local left = 0
    if oldest[2] then left = tonumber(oldest[2]) - now end
    return {i, left}
  end
end
local expires = now + tonumber(ARGV[2])
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], expires, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ARGV[5])
end
return {0, 0}
"""
RELEASE_LUA = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 0
"""


@dataclass(frozen=True)
class Wait:
    """One long-poll's place; `entry` is None when Redis could not be reached (nothing to release)."""

    credential_key: str
    endpoint_key: str
    entry: str | None


class WaitsFull(Exception):
    def __init__(self, which: str, cap: int, retry_after: int):
        super().__init__(which)
        self.which = which
        self.cap = cap
        self.retry_after = retry_after


class WaitCounter:
    def __init__(self, url: str):
        # No retries: a failed call fails open at once, not after a back-off.
        self._redis = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                           socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
                                           retry=Retry(NoBackoff(), 0))
        self._take = self._redis.register_script(TAKE_LUA)
        self._release = self._redis.register_script(RELEASE_LUA)
        self._lock = threading.Lock()
        self._skip_until = 0.0
        self._logged_at = -math.inf

    def take(self, *, credential_id, endpoint_id: str, seconds: float) -> Wait:
        """A place for a wait of up to `seconds`, or WaitsFull."""
        polling = herald_settings.polling
        credential_cap, endpoint_cap = polling.POLL_MAX_WAITS_PER_CREDENTIAL, polling.POLL_MAX_WAITS_PER_ENDPOINT
        keys = [f"{KEY_PREFIX}credential:{credential_id}", f"{KEY_PREFIX}endpoint:{endpoint_id}"]
        now = time.monotonic()
        if now < self._skip_until:
            return Wait(*keys, entry=None)
        entry = uuid.uuid4().hex
        hold_ms = math.ceil((seconds + EXPIRY_MARGIN_SECONDS) * 1000)
        live_ms = math.ceil((polling.POLL_MAX_WAIT_SECONDS + EXPIRY_MARGIN_SECONDS) * 1000) + 1000
        try:
            full, left_ms = self._take(keys=keys, args=[entry, hold_ms, credential_cap, endpoint_cap,
                                                        max(live_ms, hold_ms)])
        except redis.RedisError as exc:
            self._failed(now, exc)
            return Wait(*keys, entry=None)
        if full:
            which, cap = ("credential", credential_cap) if full == 1 else ("endpoint", endpoint_cap)
            polls_refused.labels(which).inc()
            retry_after = max(1, math.ceil(int(left_ms) / 1000 - EXPIRY_MARGIN_SECONDS))
            raise WaitsFull(which, cap, retry_after)
        return Wait(*keys, entry=entry)

    def release(self, wait: Wait) -> None:
        if wait.entry is None:
            return
        try:
            self._release(keys=[wait.credential_key, wait.endpoint_key], args=[wait.entry])
        except redis.RedisError as exc:   # it expires by itself
            self._failed(time.monotonic(), exc)

    def _failed(self, now: float, exc: Exception) -> None:
        with self._lock:
            self._skip_until = now + RETRY_AFTER_FAILURE_SECONDS
            if now - self._logged_at >= LOG_EVERY_SECONDS:
                self._logged_at = now
                logger.warning("waits.unavailable", extra={
                    "error": repr(exc),
                    "detail": "Redis cannot be reached: POLL_MAX_WAITS_* are not applied until it is back",
                })


_counter: WaitCounter | None = None
_counter_lock = threading.Lock()


def counter() -> WaitCounter:
    """This process's counter (made at its first long-poll)."""
    global _counter
    if _counter is None:
        with _counter_lock:
            if _counter is None:
                _counter = WaitCounter(herald_settings.queues.REDIS_URL)
    return _counter


def release(wait: Wait | None) -> None:
    if wait is not None:
        counter().release(wait)
