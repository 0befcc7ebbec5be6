"""An HTTP client of Herald's API that retries with the same Idempotency-Key, bounded in tries and time."""
from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field

import requests

RETRYABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Reply:
    """One HTTP answer (status None: no answer at all, e.g. connection refused or timed out)."""

    status: int | None
    body: bytes
    headers: dict[str, str]
    error: str
    sent: float
    elapsed: float

    @property
    def code(self) -> str:
        """The problem+json `code`, if any."""
        try:
            return str(json.loads(self.body).get("code", ""))
        except (ValueError, AttributeError, TypeError):
            return ""

    @property
    def replay(self) -> bool:
        return self.headers.get("idempotent-replay") == "true"

    def json(self):
        return json.loads(self.body)

    def short(self) -> str:
        if self.status is None:
            return f"no answer ({self.error[:80]})"
        return f"{self.status} {self.code}".strip()


def retryable(reply: Reply) -> bool:
    """Worth retrying with the same key: no answer, a 5xx, 429, or 409 idempotency_key_in_progress."""
    if reply.status is None:
        return True
    if reply.status == 409:
        return reply.code == "idempotency_key_in_progress"
    return reply.status in RETRYABLE_STATUSES


def canonical(body) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class Api:
    """Speaks to one Herald over HTTP with one bearer token; one requests.Session per thread.

    With `tenant` (an id or uid) the token is a platform credential acting for that tenant (SPEC §10): a tenant
    path of §4 (`/api/v1/events`, `/api/v1/endpoints/…`) is sent as `/api/v1/tenants/{tenant}/events`, …, so a
    scenario runs unchanged through either kind of credential.
    """

    base_url: str
    token: str
    timeout: float = 30.0
    tenant: str | None = None
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def path(self, path: str) -> str:
        if self.tenant is None or not path.startswith("/api/v1/") or path.startswith("/api/v1/tenants"):
            return path
        return f"/api/v1/tenants/{self.tenant}/{path.removeprefix('/api/v1/')}"

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # never a proxy: 127.0.0.1 only
            self._local.session = session
        return session

    def request(self, method: str, path: str, *, body: bytes | None = None, key: str | None = None,
                headers: dict | None = None, timeout: float | None = None) -> Reply:
        all_headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            all_headers["Content-Type"] = "application/json"
        if key is not None:
            all_headers["Idempotency-Key"] = key
        all_headers.update(headers or {})
        sent = time.monotonic()
        try:
            response = self._session().request(method, self.base_url + self.path(path), data=body, headers=all_headers,
                                               timeout=timeout or self.timeout, allow_redirects=False)
            return Reply(response.status_code, response.content, {k.lower(): v for k, v in response.headers.items()},
                         "", sent, time.monotonic() - sent)
        except requests.RequestException as exc:
            self._local.session = None  # start afresh after a broken connection
            return Reply(None, b"", {}, f"{type(exc).__name__}: {exc}"[:300], sent, time.monotonic() - sent)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post(self, path: str, body, key: str) -> Reply:
        return self.request("POST", path, body=canonical(body) if not isinstance(body, bytes) else body, key=key)

    def post_retrying(self, path: str, body, key: str, *, budget: float = 60.0, max_tries: int = 200,
                      rng: random.Random | None = None) -> list[Reply]:
        """POST with the same key until a final answer (2xx or a 4xx other than in-progress) or `budget` s.

        Backoff doubles from 0.1 s to 2 s with jitter; a Retry-After is honoured up to 2 s.
        Returns every reply, the last being the final one (or the last failure if the budget ran out).
        """
        rng = rng or random.Random()
        payload = canonical(body) if not isinstance(body, bytes) else body
        deadline = time.monotonic() + budget
        replies: list[Reply] = []
        delay = 0.1
        for _ in range(max_tries):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            reply = self.request("POST", path, body=payload, key=key, timeout=min(self.timeout, max(remaining, 1)))
            replies.append(reply)
            if not retryable(reply):
                break
            wait = delay * rng.uniform(0.5, 1.5)
            retry_after = reply.headers.get("retry-after", "")
            if retry_after.isdigit():
                wait = max(wait, min(float(retry_after), 2.0))
            delay = min(delay * 2, 2.0)
            time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
        return replies

    def create_endpoint(self, url: str, event_types: list[str], key: str, **options) -> dict:
        """POST /api/v1/endpoints (`options`: max_in_flight, channels, ...); the created endpoint, with its
        signing secret under "secret" from GET …/secret (the only call that returns it)."""
        replies = self.post_retrying("/api/v1/endpoints", {"url": url, "event_types": event_types, **options}, key,
                                     budget=60)
        final = replies[-1]
        if final.status != 201:
            raise RuntimeError(f"creating endpoint {url}: {final.short()} {final.body[:300]!r}")
        endpoint = final.json()
        secret = self.get(f"/api/v1/endpoints/{endpoint['id']}/secret")
        if secret.status != 200:
            raise RuntimeError(f"reading the secret of {endpoint['id']}: {secret.short()} {secret.body[:300]!r}")
        return {**endpoint, "secret": secret.json()["secret"]}
