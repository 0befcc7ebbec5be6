"""A minimal webhook receiver for Herald: verify the signature, de-duplicate, process, answer 200.

Run it with the endpoint's secret (`GET /api/v1/endpoints/{id}/secret` returns it): a `whsec_…` secret,
or for an endpoint with `"signature": "v1a"` its `whpk_…` ed25519 public key (such a receiver holds
nothing that could sign):

    HERALD_WEBHOOK_SECRET=whsec_... python examples/receiver.py --port 8080
    HERALD_WEBHOOK_SECRET=whpk_... python examples/receiver.py --port 8080

then point an endpoint at it, e.g. `{"url": "http://127.0.0.1:8080/webhooks"}` (Herald refuses
local addresses unless it runs with WEBHOOK_ALLOW_PRIVATE_NETWORKS=true, as `scripts/up` can).
It prints one line per processed event.

What a real receiver should copy:
- Verify against the raw body bytes, before parsing anything, with the Python client's
  `WebhookVerifier` (or `herald_client.verify`; `standardwebhooks` for v1, ed25519 for v1a); a bad or missing signature, or a timestamp more
  than 5 minutes off, is 400.
- Delivery is at-least-once, so de-duplicate on `webhook-id` (the event id, the same on every
  retry). Here it is an in-memory set; a real receiver records the id with a unique constraint in
  the same database transaction as the work the event triggers.
- Answer 2xx quickly; a failure (5xx) makes Herald retry later with the same `webhook-id`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from herald_client import WebhookVerificationError, WebhookVerifier

MAX_BODY_BYTES = 1024 * 1024

EventHandler = Callable[[str, dict], None]


def print_event(webhook_id: str, payload: dict) -> None:
    """The default handler: one line per processed event."""
    print(f"{webhook_id} {payload.get('type')} {json.dumps(payload.get('data'), sort_keys=True)}", flush=True)


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a Herald worker may open up to an endpoint's max_in_flight connections at once

    def __init__(self, address: tuple[str, int], secret: str, on_event: EventHandler):
        self.verifier = WebhookVerifier(secret)
        self.on_event = on_event
        self.lock = threading.Lock()
        self.processed: set[str] = set()
        self.in_progress: set[str] = set()
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: WebhookServer

    def do_POST(self) -> None:
        # Read nothing before the length is known to be sane: digits only (no sign, spaces or `_`, which
        # int() would take), one value, at most MAX_BODY_BYTES. A bad one answers and closes the connection,
        # since where the next request would start is unknown.
        lengths = self.headers.get_all("Content-Length") or ["0"]
        if len(set(lengths)) != 1 or not (lengths[0].isascii() and lengths[0].isdigit()):
            self.close_connection = True
            return self._answer(HTTPStatus.BAD_REQUEST, {"error": "bad Content-Length"})
        length = int(lengths[0])
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "body too large"})
        body = self.rfile.read(length)
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            payload = self.server.verifier.verify(body, headers)
        except WebhookVerificationError as exc:
            return self._answer(HTTPStatus.BAD_REQUEST, {"error": f"invalid webhook: {exc}"})

        webhook_id = headers["webhook-id"]
        server = self.server
        with server.lock:
            if webhook_id in server.processed:
                return self._answer(HTTPStatus.OK, {"status": "duplicate"})
            if webhook_id in server.in_progress:
                # The same event is being processed right now: ask for a retry rather than
                # claiming success for work that may still fail.
                return self._answer(HTTPStatus.CONFLICT, {"status": "in progress"})
            server.in_progress.add(webhook_id)
        try:
            server.on_event(webhook_id, payload)
        except Exception as exc:  # noqa: BLE001 - any failure means "not processed, retry"
            with server.lock:
                server.in_progress.discard(webhook_id)
            print(f"{webhook_id} failed: {exc!r}", file=sys.stderr, flush=True)
            return self._answer(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "processing failed"})
        with server.lock:
            server.in_progress.discard(webhook_id)
            server.processed.add(webhook_id)
        return self._answer(HTTPStatus.OK, {"status": "processed"})

    def _answer(self, status: HTTPStatus, body: dict) -> None:
        data = json.dumps(body).encode()
        head = (f"HTTP/1.1 {status.value} {status.phrase}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n"
                + ("Connection: close\r\n" if self.close_connection else "")
                + "\r\n")
        self.wfile.write(head.encode("latin-1") + data)  # headers and body in one write

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's signature
        pass  # one line per processed event is printed by the handler instead


def make_server(host: str, port: int, secret: str, on_event: EventHandler = print_event) -> WebhookServer:
    """A ready (bound, listening) receiver; call `serve_forever()` on it, e.g. in a thread.

    `port` 0 picks a free port: read it back from `server.server_address[1]` or `server.url`.
    """
    return WebhookServer((host, port), secret, on_event)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Receive and verify Herald webhooks.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--secret", default=os.environ.get("HERALD_WEBHOOK_SECRET"),
                        help="the endpoint's whsec_... secret or whpk_... public key (default: $HERALD_WEBHOOK_SECRET)")
    args = parser.parse_args(argv)
    if not args.secret:
        parser.error("--secret or $HERALD_WEBHOOK_SECRET is required")
    server = make_server(args.host, args.port, args.secret)
    print(f"receiving webhooks on {server.url}/ (Ctrl-C stops)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
