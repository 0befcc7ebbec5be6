"""One call to Herald's API, sent until it has a final answer: the retry loop and its policy.

Every POST and PATCH carries an `Idempotency-Key`, made once per call (or given by the caller) and
sent again, with the same bytes, on each retry. Herald records the key with the work in one
transaction, so a retry after a lost answer gets the original answer back (`Idempotent-Replay: true`)
instead of doing the work twice. Retried: network errors (refused, reset, timed out), 5xx, 429 and
409 `idempotency_key_in_progress`, after `Retry-After` when the answer has one, otherwise after a
capped exponential backoff with jitter. Every other answer is final.
"""
from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import requests

from herald_client._version import __version__
from herald_client.errors import APIError, HeraldConnectionError, error_from_response

logger = logging.getLogger("herald_client")

IN_PROGRESS = "idempotency_key_in_progress"
# A TLS failure (a certificate that does not verify) is not cured by waiting: it is raised at once.
_NOT_RETRIED = (requests.exceptions.SSLError, requests.exceptions.InvalidURL, requests.exceptions.InvalidHeader)
_RETRIED = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)

Timeout = Union[float, tuple[float, float]]


@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried. Attempt n waits `min(max_delay, base_delay * 2**(n-1))` times a random
    factor in [0.5, 1] ("equal jitter", so that many clients do not retry in step), or `Retry-After`
    when the answer has one, capped at `max_delay`. `max_attempts` counts the first send."""

    max_attempts: int = 6
    base_delay: float = 0.5
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based) when Herald named no time."""
        return min(self.max_delay, self.base_delay * 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)


NO_RETRIES = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class RetryInfo:
    """What `on_retry` is told before the client waits and sends the call again."""

    method: str
    url: str
    attempt: int  # the attempt that just failed, 1-based
    delay: float  # seconds the client now waits
    idempotency_key: str | None
    status: int | None = None  # the answer's status, or None for a network error
    code: str | None = None  # the answer's problem code, if any
    error: BaseException | None = None  # the network error, if no answer came

    def describe(self) -> str:
        """A one-line reason, e.g. `HTTP 409 idempotency_key_in_progress` or `ConnectionError: …`."""
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        return f"HTTP {self.status}" + (f" {self.code}" if self.code else "")


@dataclass
class Response:
    """Herald's final answer to one call (a 2xx; errors are raised as `APIError`s)."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    idempotency_key: str | None
    attempts: int
    _json: Any = field(default=None, repr=False)

    @property
    def replayed(self) -> bool:
        """True when Herald answered from its idempotency store: an earlier attempt (or an earlier call
        with the same key) had already executed, and nothing ran again."""
        return self.headers.get("Idempotent-Replay") == "true"

    def json(self) -> Any:
        """The parsed body (None for an empty one, e.g. a 204)."""
        if self._json is None and self.content:
            self._json = json.loads(self.content)
        return self._json


def _log_retry(info: RetryInfo) -> None:
    logger.info("%s %s: attempt %d: %s; retrying in %.2fs%s", info.method, info.url, info.attempt,
                info.describe(), info.delay, " with the same Idempotency-Key" if info.idempotency_key else "")


class Transport:
    """The HTTP side of a `Herald` client: base URL, token, session, timeouts and the retry loop."""

    def __init__(self, base_url: str, token: str, *, retry: RetryPolicy, timeout: Timeout,
                 session: requests.Session | None, on_retry: Callable[[RetryInfo], None] | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.timeout = timeout
        self.on_retry = on_retry or _log_retry
        self._own_session = session is None
        self.session = session or requests.Session()
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                         "User-Agent": f"herald-client-python/{__version__} requests/{requests.__version__}"}

    def close(self) -> None:
        if self._own_session:
            self.session.close()

    def request(self, method: str, path: str, *, json_body: Any = None, params: Mapping[str, Any] | None = None,
                idempotency_key: str | None = None, timeout: Timeout | None = None,
                retry: RetryPolicy | None = None) -> Response:
        """Send `method path` until it has a final answer; return it, or raise `APIError` for an error
        answer and `HeraldConnectionError` when no answer came from any attempt.

        `path` is relative to the API root (`/api/v1/`) unless it starts with `/`. POST and PATCH get an
        `Idempotency-Key` (`idempotency_key`, or a new UUID) that every retry reuses.
        """
        method = method.upper()
        retry = retry or self.retry
        url = self.base_url + (path if path.startswith("/") else "/api/v1/" + path)
        headers = dict(self._headers)
        if method in ("POST", "PATCH"):
            idempotency_key = idempotency_key or str(uuid.uuid4())
            headers["Idempotency-Key"] = idempotency_key
        else:
            idempotency_key = None
        data: bytes | None = None
        if json_body is not None or method in ("POST", "PATCH"):
            # The same bytes on every attempt: Herald compares a retry's fingerprint with the first's.
            data = json.dumps({} if json_body is None else json_body, separators=(",", ":"),
                              ensure_ascii=False).encode()
            headers["Content-Type"] = "application/json"
        query = {name: value for name, value in (params or {}).items() if value is not None}
        lost_answer = False  # an earlier attempt may have executed without us seeing the answer
        for attempt in range(1, retry.max_attempts + 1):
            try:
                answer = self.session.request(method, url, data=data, params=query, headers=headers,
                                              timeout=timeout if timeout is not None else self.timeout,
                                              allow_redirects=False)
            except _NOT_RETRIED:
                raise
            except _RETRIED as exc:
                if attempt == retry.max_attempts:
                    raise HeraldConnectionError(
                        f"{method} {url}: no answer after {attempt} attempt(s): {type(exc).__name__}: {exc}",
                        attempts=attempt, idempotency_key=idempotency_key) from exc
                lost_answer = True
                self._wait(RetryInfo(method, url, attempt, retry.backoff(attempt), idempotency_key, error=exc))
                continue
            content = answer.content
            status = answer.status_code
            if status < 400:
                return Response(status, answer.headers, content, idempotency_key, attempt)
            if method == "DELETE" and status == 404 and lost_answer:
                # DELETE is idempotent: an earlier attempt whose answer was lost did the deletion.
                return Response(204, answer.headers, b"", idempotency_key, attempt)
            error = error_from_response(status, answer.reason, answer.headers, content,
                                        idempotency_key=idempotency_key, attempts=attempt)
            if not _retryable(error) or attempt == retry.max_attempts:
                raise error
            lost_answer = lost_answer or status >= 500
            retry_after = error.retry_after
            delay = min(retry_after, retry.max_delay) if retry_after is not None else retry.backoff(attempt)
            self._wait(RetryInfo(method, url, attempt, delay, idempotency_key, status=status, code=error.code))
        raise AssertionError("unreachable: the loop returns or raises")

    def _wait(self, info: RetryInfo) -> None:
        self.on_retry(info)
        time.sleep(info.delay)


def _retryable(error: APIError) -> bool:
    """5xx, 429, 408 and 409 in progress may go differently next time; every other answer is final."""
    return error.status >= 500 or error.status in (408, 429) or (error.status == 409 and error.code == IN_PROGRESS)


__all__ = ["NO_RETRIES", "Response", "RetryInfo", "RetryPolicy", "Timeout", "Transport"]
