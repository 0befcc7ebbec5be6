"""Per-credential rate limit on every /api/ call (SPEC §1 `INTAKE_RATE_LIMIT_PER_SECOND`).

One token bucket per credential in Redis, kept as GCRA (the "generic cell rate algorithm": one
number per credential, the theoretical arrival time of its next call), updated by one Lua script
under Redis's clock, so every web process on every host shares the same bucket and their clocks do
not matter. A call over the limit is answered 429 `throttled` with `Retry-After` before the
idempotency layer sees it: nothing is stored, the key stays free for the retry.

If Redis cannot be reached the limit is not applied (fail open: intake matters more than the
limit) and the log says so, once per LOG_EVERY_SECONDS; Redis is then left alone for
RETRY_AFTER_FAILURE_SECONDS, so an outage costs requests no time-outs.
"""
from __future__ import annotations

import logging
import math
import threading
import time

import redis
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponse
from redis.backoff import NoBackoff
from redis.retry import Retry

from intake.credentials import credential_from_authorization
from intake.idempotency.middleware import guarded
from intake.metrics import api_throttled
from intake.problems import problem_response
from webhooks.conf import herald_settings

logger = logging.getLogger("herald.ratelimit")

KEY_PREFIX = "herald:ratelimit:"
REDIS_TIMEOUT_SECONDS = 0.25
RETRY_AFTER_FAILURE_SECONDS = 1.0
LOG_EVERY_SECONDS = 10.0

# KEYS[1]: the credential's bucket; ARGV[1]: microseconds per call; ARGV[2]: the burst, in microseconds.
# Returns 0 (allowed, recorded) or the microseconds until a call would be allowed (nothing recorded).
GCRA_LUA = """
local now_parts = redis.call('TIME')
local now = now_parts[1] * 1000000 + now_parts[2]
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local wait = tat + interval - tonumber(ARGV[2]) - now
if wait > 0 then return wait end
redis.call('SET', KEYS[1], tat + interval, 'PX', math.ceil((tat + interval - now) / 1000) + 1)
return 0
"""


class RateLimiter:
    """The shared bucket of each credential; `wait_seconds(id)` is 0 for a call that may go ahead."""

    def __init__(self, url: str, per_second: float, burst: int):
        self.interval_us = 1_000_000 / per_second
        self.burst_us = self.interval_us * burst
        # No retries: a failed call is answered by failing open at once, not after a back-off.
        self._redis = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                           socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
                                           retry=Retry(NoBackoff(), 0))
        self._script = self._redis.register_script(GCRA_LUA)
        self._lock = threading.Lock()
        self._skip_until = 0.0
        self._logged_at = -math.inf

    def wait_seconds(self, credential_id: int) -> float:
        now = time.monotonic()
        if now < self._skip_until:
            return 0.0
        try:
            wait_us = self._script(keys=[f"{KEY_PREFIX}{credential_id}"], args=[self.interval_us, self.burst_us])
        except redis.RedisError as exc:
            self._failed(now, exc)
            return 0.0
        return int(wait_us) / 1_000_000

    def _failed(self, now: float, exc: Exception) -> None:
        with self._lock:
            self._skip_until = now + RETRY_AFTER_FAILURE_SECONDS
            if now - self._logged_at >= LOG_EVERY_SECONDS:
                self._logged_at = now
                logger.warning("ratelimit.unavailable", extra={
                    "error": repr(exc),
                    "detail": "Redis cannot be reached: INTAKE_RATE_LIMIT_PER_SECOND is not applied until it is back",
                })


class RateLimitMiddleware:
    """429 `throttled` for a credential over its rate, before authentication errors or idempotency."""

    def __init__(self, get_response):
        if herald_settings.api.INTAKE_RATE_LIMIT_PER_SECOND <= 0:
            raise MiddlewareNotUsed
        self.get_response = get_response
        self.per_second = herald_settings.api.INTAKE_RATE_LIMIT_PER_SECOND
        self.limiter = RateLimiter(herald_settings.queues.REDIS_URL, self.per_second,
                                   herald_settings.api.INTAKE_RATE_LIMIT_BURST)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith("/api/"):  # the routed path: never the client-influenced mount point
            # Cached only where the idempotency layer checks it again (intake/credentials.py).
            credential = credential_from_authorization(request.META.get("HTTP_AUTHORIZATION"),
                                                       cached=guarded(request))
            if credential is not None:
                request.herald_credential = credential   # the idempotency layer and DRF use it as it is
                wait = self.limiter.wait_seconds(credential.id)
                if wait > 0:
                    return self._throttled(wait)
        return self.get_response(request)

    def _throttled(self, wait: float) -> HttpResponse:
        api_throttled.inc()
        retry_after = max(1, math.ceil(wait))
        return problem_response(
            status_code=429, code="throttled",
            detail=f"This credential is over its limit of {self.per_second:g} API calls per second; "
                   f"retry in {retry_after} s.",
            headers={"Retry-After": str(retry_after)})
