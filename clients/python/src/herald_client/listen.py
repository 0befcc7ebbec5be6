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

What the server sends is not trusted further than it has to be: only the Standard Webhooks headers
(`webhook-id`, `webhook-timestamp`, `webhook-signature`) and `content-type` are forwarded, never a
`Host`, `Authorization`, `Cookie` or framing header; control characters (terminal escape sequences) are
taken out of every line printed; a message that cannot be forwarded (a header value with a line break,
no headers at all, or a failure other than an unreachable server after MAX_TRIES tries) is reported and
skipped, so it does not hold up the ones after it (`POST /deliveries/{id}/retry` sends it again); a
redirect is shown as the local server's error answer, never followed.
"""
from __future__ import annotations

import json
import re
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
MAX_TRIES = 3  # for a failure other than an unreachable local server
# What a POST from Herald carries that the local handler needs: the signature's headers and the body's type.
FORWARDED_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature", "content-type")
# C0 and C1 controls, DEL, and the bidirectional overrides: a terminal acts on them (colours, titles,
# hyperlinks, cursor moves, text shown reversed).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without control characters, for a terminal."""
    return _CONTROL.sub("", text)


class _NoRedirects(requests.Session):
    """A session that never works out where a redirect leads: with `allow_redirects=False` requests still
    parses `Location`, and raises on one it cannot parse."""

    def get_redirect_target(self, resp: requests.Response) -> None:
        return None


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
        self.forwarder = _NoRedirects()
        self.created: str | None = None
        self.cursor: str | None = None   # the last page forwarded whole, acknowledged by the next read

    def say(self, line: str) -> None:
        print(printable(line), file=self.out, flush=True)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _interrupt)
        # Ctrl-C stops it even when started from a shell's background job, which inherits SIGINT ignored
        # (Python then leaves it ignored, and the long-poll would run out its wait before the clean-up)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
        delivery_id = str(message.get("delivery_id", "?"))
        received = message.get("headers")
        headers = ({name.lower(): value for name, value in received.items()
                    if isinstance(name, str) and name.lower() in FORWARDED_HEADERS}
                   if isinstance(received, dict) else {})
        event_id = str(headers.get("webhook-id", delivery_id))
        body_text = message.get("body")
        body = body_text.encode("utf-8") if isinstance(body_text, str) else b""
        try:
            event_type = str(json.loads(body).get("type", "?"))
        except (ValueError, AttributeError):
            event_type = "?"
        unfit = ("its headers are missing" if not isinstance(received, dict) or not isinstance(body_text, str)
                 else next((f"its {name} header is not one line of text" for name, value in headers.items()
                            if not isinstance(value, str) or _CONTROL.search(value)), None))
        if unfit:
            return self._skip(event_id, event_type, delivery_id, unfit)
        backoff, tries = 1.0, 0
        while True:
            started = time.monotonic()
            tries += 1
            try:
                answer = self.forwarder.post(self.options.forward_to, data=body, headers=headers,
                                             timeout=FORWARD_TIMEOUT, allow_redirects=False)
            except (requests.ConnectionError, requests.Timeout) as exc:
                self.say(f"→ no answer ({type(exc).__name__})  {event_id} {event_type}: kept, "
                         f"trying again in {backoff:g} s")
            except Exception as exc:  # noqa: BLE001 - whatever it is, one message must not stop the others
                if tries >= MAX_TRIES:
                    return self._skip(event_id, event_type, delivery_id, f"{type(exc).__name__}: {exc}")
                self.say(f"→ not sent ({type(exc).__name__}: {exc})  {event_id} {event_type}: "
                         f"trying again in {backoff:g} s")
            else:
                elapsed_ms = (time.monotonic() - started) * 1000
                note = "  (a redirect: not followed)" if answer.is_redirect or 300 <= answer.status_code < 400 else ""
                self.say(f"→ {answer.status_code} in {elapsed_ms:.0f} ms  {event_id} {event_type}{note}")
                return
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _skip(self, event_id: str, event_type: str, delivery_id: str, why: str) -> None:
        self.say(f"→ skipped  {event_id} {event_type}: cannot be forwarded ({why}); "
                 f"POST /deliveries/{delivery_id}/retry sends it again")

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
