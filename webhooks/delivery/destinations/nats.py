"""The `nats` destination (SPEC §14): a JetStream publish to the tenant's NATS, on nats-py, with the webhook
headers and `Nats-Msg-Id` set to the `webhook-id`, so that the stream de-duplicates a resent message.

Fields: `url` (`nats://[user:pass@]host:4222`, or `tls://`; a user name alone is a token), `subject`. Success is
the stream's ack (PubAck); no stream for the subject ("no responders"), an API error or a connection error is
a failed attempt. nats-py is asyncio: this process's connections live on one event loop of their own, on a
daemon thread, and a batch's publishes are awaited together (one round trip).
"""
from __future__ import annotations

import asyncio
import re
import ssl
import threading
import time

import nats
from nats.js.errors import APIError

from webhooks.delivery.destinations import brokers

kind = "nats"
ports = {"nats": 4222, "tls": 4222}
fields = ("subject",)
# A publish subject: tokens separated by dots, no wildcards or white space.
_SUBJECT = re.compile(r"[^.*>\s]+(\.[^.*>\s]+)*")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def options_validate(given: dict, current: dict | None) -> dict:
    merged = {**(current or {}), **given}
    return {"subject": brokers.name_validate(merged, "subject", required=True, pattern=_SUBJECT)}


def loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for NATS connections (started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="herald-nats", daemon=True).start()
        return _loop


def _run(coroutine, deadline: float):
    future = asyncio.run_coroutine_threadsafe(coroutine, loop())
    try:
        return future.result(max(deadline - time.monotonic(), 0.001) + 0.5)
    except TimeoutError:
        future.cancel()
        raise TimeoutError("timeout: the broker did not answer within the deadline") from None


class _Connection:
    def __init__(self, target: brokers.Target, address: str, timeout: float) -> None:
        parts = target.parts
        user, password = brokers.credentials(target)
        host = f"[{address}]" if ":" in address else address
        options: dict = {"servers": [f"nats://{host}:{parts.port or ports[parts.scheme]}"],
                         "connect_timeout": timeout, "allow_reconnect": False, "max_reconnect_attempts": 0,
                         "name": "Herald"}
        if user and password:
            options.update(user=user, password=password)
        elif user:
            options["token"] = user
        if parts.scheme == "tls":
            options.update(tls=ssl.create_default_context(), tls_hostname=parts.hostname)
        self._subject = target.options["subject"]
        self._client = _run(self._connect(options), time.monotonic() + timeout)

    @staticmethod
    async def _connect(options):
        async def quiet(exc):  # nats-py logs errors itself otherwise; a failed publish says what happened
            return None

        client = await nats.connect(**options, error_cb=quiet)
        return client, client.jetstream()

    async def _publish(self, messages: list[brokers.Message], timeout: float) -> list:
        _, stream = self._client

        async def one(message: brokers.Message):
            headers = {name: message.headers[name] for name in brokers.MESSAGE_HEADERS if name in message.headers}
            headers["Nats-Msg-Id"] = headers["webhook-id"]
            ack = await stream.publish(self._subject, message.body, timeout=timeout, headers=headers)
            return f"stream {ack.stream} seq {ack.seq}" + (" (duplicate)" if ack.duplicate else "")

        return await asyncio.gather(*(one(message) for message in messages), return_exceptions=True)

    def publish(self, messages: list[brokers.Message], deadline: float) -> list[str | Exception]:
        client, _ = self._client
        if not client.is_connected:
            raise ConnectionError("the connection to the broker is closed")
        answers = _run(self._publish(messages, max(deadline - time.monotonic(), 0.001)), deadline)
        out: list[str | Exception] = []
        for answer in answers:
            if isinstance(answer, APIError):
                out.append(RuntimeError(f"nats_error: {answer.description or answer}"))
            elif isinstance(answer, asyncio.TimeoutError | TimeoutError):
                out.append(RuntimeError("timeout: no ack from the stream within the deadline"))
            elif isinstance(answer, BaseException):
                out.append(RuntimeError(f"nats_error: {type(answer).__name__}: {answer}"))
            else:
                out.append(answer)
        if not client.is_connected:
            raise ConnectionError("the connection to the broker closed")
        return out

    def close(self) -> None:
        client, _ = self._client
        try:
            _run(client.close(), time.monotonic() + 2)
        except Exception:  # noqa: BLE001 - dropped all the same
            pass


def connect(target: brokers.Target, address: str, timeout: float) -> _Connection:
    return _Connection(target, address, timeout)


classify = brokers.classify  # delivered or not: a broker is never gone for good, and sets no Retry-After
