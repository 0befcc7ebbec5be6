"""Post one event to Herald, retrying safely with the same Idempotency-Key.

Run it (with Herald up, e.g. `scripts/up`, which prints a demo token):

    python examples/client.py --url http://127.0.0.1:8000 --token TOKEN \\
        --type invoice.paid --data '{"invoice": "in_1"}'

It prints the final response's JSON on stdout (exit status 0 on 2xx, 1 otherwise). `--url` and
`--token` default to the environment variables HERALD_URL and HERALD_TOKEN.

The point of the example is the retry loop in `post_event`: one Idempotency-Key is generated per
event and reused on every retry, so a retry after a timeout (where the first request may well
have been recorded) gets the original answer back instead of creating a second event. Retried:
network errors (refused, reset, timeouts), 5xx, 429 and 409 `idempotency_key_in_progress`,
honouring Retry-After, otherwise with capped exponential backoff and jitter. Not retried: every
other 4xx (400, 401, 404, 409 `idempotency_key_reused`, 413, 415, 422): the same request would
get the same answer.
"""
from __future__ import annotations

import argparse
import email.utils
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Callable

import requests

RETRY_IN_PROGRESS_CODE = "idempotency_key_in_progress"


def post_event(
    url: str,
    token: str,
    type: str,  # noqa: A002 - the API's field name
    data: object,
    *,
    key: str | None = None,
    max_attempts: int = 6,
    session: requests.Session | None = None,
    channels: list[str] | None = None,
    timeout: float = 10.0,
    base_delay: float = 0.5,
    max_delay: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> requests.Response:
    """POST `{type, data[, channels]}` to `{url}/api/v1/events`; return the final response.

    Every attempt sends the same bytes with the same Idempotency-Key (`key`, or a new UUID).
    Returns the last response, retryable or not, once attempts run out; raises the last
    `requests.ConnectionError` / `requests.Timeout` if the final attempt got no response at all.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    key = key or str(uuid.uuid4())
    body: dict[str, object] = {"type": type, "data": data}
    if channels:
        body["channels"] = channels
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = {
        "Authorization": f"Bearer {token}",
        "Idempotency-Key": key,
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    endpoint = url.rstrip("/") + "/api/v1/events"
    own_session = session is None
    session = session or requests.Session()
    try:
        for attempt in range(1, max_attempts + 1):
            try:
                response = session.post(endpoint, data=payload, headers=headers, timeout=timeout,
                                        allow_redirects=False)
            except (requests.ConnectionError, requests.Timeout) as exc:
                # ConnectionError covers refused and reset connections (and a read timeout
                # raised while streaming); Timeout covers connect and read timeouts.
                if attempt == max_attempts:
                    raise
                delay = _backoff(attempt, base_delay, max_delay)
                _log(f"attempt {attempt}: {_describe(exc)}; retrying in {delay:.2f}s with the same key")
                sleep(delay)
                continue
            if not _retryable(response) or attempt == max_attempts:
                return response
            retry_after = _retry_after(response)
            delay = min(retry_after, max_delay) if retry_after is not None else _backoff(attempt, base_delay, max_delay)
            _log(f"attempt {attempt}: HTTP {response.status_code} {_code(response) or ''}".rstrip()
                 + f"; retrying in {delay:.2f}s with the same key")
            response.close()
            sleep(delay)
        raise AssertionError("unreachable")  # the loop always returns or raises
    finally:
        if own_session:
            session.close()


def _retryable(response: requests.Response) -> bool:
    if response.status_code >= 500 or response.status_code == 429:
        return True
    return response.status_code == 409 and _code(response) == RETRY_IN_PROGRESS_CODE


def _code(response: requests.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


def _retry_after(response: requests.Response) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date), or None if absent or unreadable."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _backoff(attempt: int, base_delay: float, max_delay: float) -> float:
    """Exponential backoff with jitter: attempt 1 → ~base, 2 → ~2·base, … capped at max_delay."""
    return min(max_delay, base_delay * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def _describe(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"


def _log(message: str) -> None:
    print(f"herald-client: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Post one event to Herald with safe retries.")
    parser.add_argument("--url", default=os.environ.get("HERALD_URL", "http://127.0.0.1:8000"),
                        help="Herald's base URL (default: $HERALD_URL or http://127.0.0.1:8000)")
    parser.add_argument("--token", default=os.environ.get("HERALD_TOKEN"),
                        help="API token (default: $HERALD_TOKEN)")
    parser.add_argument("--type", required=True, help="event type, e.g. invoice.paid")
    parser.add_argument("--data", default="{}", help="event data as JSON (default: {})")
    parser.add_argument("--channel", action="append", dest="channels", help="a channel (repeatable)")
    parser.add_argument("--key", help="Idempotency-Key to use (default: a new UUID)")
    parser.add_argument("--max-attempts", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per attempt")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token or $HERALD_TOKEN is required")
    try:
        data = json.loads(args.data)
    except ValueError as exc:
        parser.error(f"--data is not JSON: {exc}")

    try:
        response = post_event(args.url, args.token, args.type, data, key=args.key,
                              max_attempts=args.max_attempts, channels=args.channels, timeout=args.timeout)
    except (requests.ConnectionError, requests.Timeout) as exc:
        _log(f"giving up: {_describe(exc)}")
        return 1
    _log(f"HTTP {response.status_code}"
         + (" (replayed)" if response.headers.get("Idempotent-Replay") == "true" else ""))
    try:
        print(json.dumps(response.json(), indent=2))
    except ValueError:
        print(response.text)
    return 0 if 200 <= response.status_code < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
