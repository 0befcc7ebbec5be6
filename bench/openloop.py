"""An open-loop load generator: events POSTed at a fixed rate, each at its own scheduled instant.

Event `i` of a run is due at `start + i / rate`, whatever happened to the ones before it. `threads`
client threads (64, as in issue 23's measurement) each keep one keep-alive connection and take the
next due event; when all of them are busy the next send goes out late, and its latency is still
counted from the instant it was due, so a slow server cannot hide its queueing by slowing the client
down (coordinated omission). Every event has an Idempotency-Key of its own; a send whose kept-alive
connection the server had closed is sent again on a new one with the same key (that is what the key
is for), anything else counts as refused.
"""
from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass
class Sent:
    due: float  # wall clock (time.time(), as the receiver's), when the event was meant to be POSTed
    sent: float  # when the request actually went out
    answered: float  # when its answer was read (or the error seen)
    status: int | None  # HTTP status, None on a connection error or timeout
    event_id: str | None  # the 202's event id (the deliveries' webhook-id)


def _post(conn, connect, path: str, body: str, headers: dict):
    """POST on a keep-alive connection, once more on a fresh one after a RETRYABLE error (a connection the
    server closed while idle); (the connection to go on with, status or None, body or None)."""
    for attempt in (1, 2):
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            return conn, response.status, response.read()
        except RETRYABLE:
            conn.close()
            conn = connect()
            if attempt == 2:
                break
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = connect()
            break
    return conn, None, None


def offer(url: str, token: str, *, rate: float, seconds: float, run: str, threads: int = 64,
          event_type: str = "invoice.paid", timeout: float = 30) -> list[Sent]:
    """POST `rate * seconds` events to `url` (`…/api/v1/events`) at `rate` per second; one Sent each, in order."""
    parts = urlsplit(url)
    total = int(rate * seconds)
    results: list[Sent | None] = [None] * total
    counter = itertools.count()  # next() on it is atomic under the GIL
    start = time.time() + 0.2
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def connect() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)

    def client() -> None:
        conn = connect()
        while (i := next(counter)) < total:
            due = start + i / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            sent = time.time()
            body = json.dumps({"type": event_type, "data": {"n": i, "run": run}})
            conn, status, answer = _post(conn, connect, parts.path, body, {**headers, "Idempotency-Key": f"{run}-{i}"})
            event_id = json.loads(answer)["id"] if status == 202 else None
            results[i] = Sent(due, sent, time.time(), status, event_id)
        conn.close()

    workers = [threading.Thread(target=client, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def offer_batches(url: str, token: str, *, rate: float, seconds: float, run: str, size: int = 100,
                  threads: int = 8, event_type: str = "invoice.paid", timeout: float = 30) -> list[Sent]:
    """POST `rate * seconds` events to `url` (`…/api/v1/events/batch`) in batches of `size`, batch `j` due at
    `start + j * size / rate` (open loop, as `offer`); one Sent per event, in order (a batch's events share
    its due, sent and answered instants and its status)."""
    parts = urlsplit(url)
    batches = max(1, int(rate * seconds) // size)
    results: list[list[Sent] | None] = [None] * batches
    counter = itertools.count()
    start = time.time() + 0.2
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def connect() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)

    def client() -> None:
        conn = connect()
        while (j := next(counter)) < batches:
            due = start + j * size / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            sent = time.time()
            body = json.dumps({"events": [{"type": event_type, "data": {"n": j * size + i, "run": run}}
                                          for i in range(size)]})
            conn, status, answer = _post(conn, connect, parts.path, body, {**headers, "Idempotency-Key": f"{run}-{j}"})
            event_ids = [event["id"] for event in json.loads(answer)["data"]] if status == 202 else [None] * size
            answered = time.time()
            results[j] = [Sent(due, sent, answered, status, event_id) for event_id in event_ids]
        conn.close()

    workers = [threading.Thread(target=client, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [sent for batch in results for sent in batch]
