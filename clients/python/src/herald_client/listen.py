"""`herald listen --forward-to URL`: receive a Herald tenant's webhooks on a machine nobody can reach.

Herald never connects to the developer's machine: `listen` makes a polling endpoint (or uses the one
given), long-polls its messages and POSTs each to the local URL with the Standard Webhooks headers Herald
signed, as they are, so the local handler verifies them with the endpoint's secret as it would in
production. One line per message; on Ctrl-C the endpoint it made is deleted.

Acknowledgement: a page of messages is acknowledged (its deliveries become `succeeded` in Herald) by the
next read, and only once every message of it was forwarded. A message counts as forwarded when the local
server answered, whatever the status (the line shows it; `POST /deliveries/{id}/retry` sends it again).
When the local server cannot be reached (refused, reset, no answer within the timeout) the message is
not acknowledged: `listen` tries it again, 1, 2, 4… up to 10 s apart, and the ones after it wait, so
they reach the local server in event order.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

import requests

from herald_client._http import RetryPolicy
from herald_client.client import Endpoints, Herald
from herald_client.errors import APIError, HeraldConnectionError
from herald_client.types import Message

WAIT_SECONDS = 30.0
FORWARD_TIMEOUT = (5.0, 30.0)
MAX_BACKOFF = 10.0


@dataclass
class Options:
    forward_to: str
    api: str
    token: str
    tenant: str | None = None
    events: list[str] | None = None
    endpoint: str | None = None
    wait: float = WAIT_SECONDS


class Listener:
    """One `herald listen` run: `run()` returns when stopped (SIGINT/SIGTERM), after cleaning up."""

    def __init__(self, options: Options, out: IO[str] = sys.stdout) -> None:
        self.options = options
        self.out = out
        self.herald = Herald(options.api, options.token, retry=RetryPolicy(max_attempts=4))
        scope = self.herald.tenant(options.tenant) if options.tenant else self.herald
        self.endpoints: Endpoints = scope.endpoints   # `--tenant`: /api/v1/tenants/{tenant}/… (a path prefix)
        self.forwarder = requests.Session()
        self.created: str | None = None
        self.cursor: str | None = None   # the last page forwarded whole, acknowledged by the next read

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            endpoint_id = self._open()
            while True:
                page = self._read(endpoint_id)
                for message in page["data"]:
                    self._forward(message)
                self.cursor = page["next_cursor"]
        except KeyboardInterrupt:
            self.say("Stopping.")
            return 0
        except ListenError as exc:
            self.say(str(exc))
            return 2
        except APIError as exc:
            self.say(f"Herald refused: {exc}")
            return 1
        finally:
            self._close()

    def _open(self) -> str:
        if self.options.endpoint:
            endpoint = self.endpoints.get(self.options.endpoint)
            if endpoint.get("kind") != "poll":
                raise ListenError(f"{endpoint['id']} is not a poll endpoint: Herald POSTs its messages to "
                                  f"{endpoint.get('url')}. Leave --endpoint out to have one made.")
        else:
            endpoint = self.endpoints.create(kind="poll", event_types=self.options.events or None,
                                             description=f"herald listen → {self.options.forward_to}")
            self.created = endpoint["id"]
        secret = self.endpoints.secret(endpoint["id"])
        self.say(f"Endpoint {endpoint['id']} ({'made for this session' if self.created else 'given'}), "
                 f"events: {', '.join(endpoint['event_types']) or 'all'}")
        self.say(f"Signing secret {secret}")
        self.say(f"Forwarding to {self.options.forward_to}. Ctrl-C to stop.")
        return endpoint["id"]

    def _read(self, endpoint_id: str) -> Any:
        backoff = 1.0
        while True:
            try:
                return self.endpoints.messages(endpoint_id, after=self.cursor, wait=self.options.wait)
            except HeraldConnectionError as exc:
                self.say(f"Herald cannot be reached ({exc}); trying again in {backoff:g} s")
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _forward(self, message: Message) -> None:
        body = message["body"].encode("utf-8")
        try:
            event_type = json.loads(body).get("type", "?")
        except ValueError:
            event_type = "?"
        event_id = message["headers"].get("webhook-id", message["delivery_id"])
        backoff = 1.0
        while True:
            started = time.monotonic()
            try:
                answer = self.forwarder.post(self.options.forward_to, data=body, headers=message["headers"],
                                             timeout=FORWARD_TIMEOUT, allow_redirects=False)
            except requests.RequestException as exc:
                self.say(f"→ no answer ({type(exc).__name__})  {event_id} {event_type}: kept, "
                         f"trying again in {backoff:g} s")
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            elapsed_ms = (time.monotonic() - started) * 1000
            self.say(f"→ {answer.status_code} in {elapsed_ms:.0f} ms  {event_id} {event_type}")
            return

    def _close(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the clean-up short
        try:
            if self.created:
                self.endpoints.delete(self.created)
                self.say(f"Deleted endpoint {self.created}.")
            elif self.options.endpoint and self.cursor is not None:
                # the last page forwarded is acknowledged now, not sent again by the next run
                self.endpoints.messages(self.options.endpoint, after=self.cursor, limit=1)
        except (APIError, HeraldConnectionError) as exc:
            self.say(f"Clean-up failed: {exc}")
        finally:
            self.herald.close()
            self.forwarder.close()
            signal.signal(signal.SIGINT, signal.default_int_handler)


class ListenError(Exception):
    """Something `listen` cannot go on with, said in a sentence."""


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
