"""Post one event to Herald with the Python client (`herald_client`), retrying safely with one key.

Run it (with Herald up, e.g. `scripts/up`, which prints a demo token; `pip install ./clients/python`
first if you are not in the project's `.venv`, which has it):

    python examples/client.py --url http://127.0.0.1:8000 --token TOKEN \\
        --type invoice.paid --data '{"invoice": "in_1"}'

It prints the event's JSON on stdout (exit status 0), or Herald's problem+json error (exit status 1).
`--url` and `--token` default to the environment variables HERALD_URL and HERALD_TOKEN.

What it shows: `herald.events.create` sends one Idempotency-Key per event and reuses it on every
retry, so a retry after a timeout (where the first request may well have been recorded) gets the
original answer back instead of creating a second event. Retried: network errors (refused, reset,
timeouts), 5xx, 429 and 409 `idempotency_key_in_progress`, honouring Retry-After, otherwise with
capped exponential backoff and jitter; each retry is reported on stderr. Not retried: every other
4xx (400, 401, 404, 409 `idempotency_key_reused`, 413, 415, 422): the same request would get the
same answer; they are raised as typed errors (`herald_client.ValidationError`, …).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from herald_client import APIError, Herald, HeraldConnectionError, RetryInfo, RetryPolicy
from herald_client.types import Event


def report_retry(info: RetryInfo) -> None:
    """`on_retry`: one line on stderr before each retry."""
    same = " with the same key" if info.idempotency_key else ""
    _log(f"attempt {info.attempt}: {info.describe()}; retrying in {info.delay:.2f}s{same}")


def post_event(herald: Herald, type: str, data: Any, *,  # noqa: A002 - the API's field name
               channels: list[str] | None = None, key: str | None = None) -> Event:
    """Post `{type, data[, channels]}` once, whatever the retries; the recorded event.

    `key` is the Idempotency-Key (default: a new UUID for this call). Pass one derived from your own
    operation (`f"invoice-{invoice_id}-paid"`) and even a retry by your own code, from another process
    or after a crash, is a replay instead of a second event.
    """
    return herald.events.create(type, data, channels=channels, idempotency_key=key)


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

    with Herald(args.url, args.token, timeout=args.timeout, retry=RetryPolicy(max_attempts=args.max_attempts),
                on_retry=report_retry) as herald:
        try:
            event = post_event(herald, args.type, data, channels=args.channels, key=args.key)
        except HeraldConnectionError as exc:
            _log(f"giving up: {exc}")
            return 1
        except APIError as exc:
            _log(f"HTTP {exc.status} {exc.code or exc.title}")
            try:
                print(json.dumps(json.loads(exc.body), indent=2))
            except ValueError:  # not JSON: a proxy's error page
                print(exc.body.decode("utf-8", "replace"))
            return 1
    print(json.dumps(event, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
