"""The `amqp` destination (SPEC §14): a persistent message to the tenant's RabbitMQ (AMQP 0-9-1), with publisher
confirms and `mandatory`, on py-amqp (the client Celery's own broker connection uses).

Fields: `url` (`amqp://user:pass@host:5672/vhost`, or `amqps://`), `exchange`, `routing_key`. The message's body
is the webhook's bytes, its `message_id` the `webhook-id`, its `content_type` `application/json`, and the webhook
headers are its headers. Success is the broker's confirm (basic.ack); a basic.nack, a basic.return (no queue
took it: `mandatory`), a closed channel (no such exchange) or a connection error is a failed attempt.

A batch is published in one go and its confirms awaited together (the channel is in confirm mode: each publish
is numbered, an ack may confirm many), so a batch costs one round trip, not one per message.
"""
from __future__ import annotations

import re
import ssl
import time
from urllib.parse import unquote

import amqp

from webhooks.delivery.destinations import brokers

kind = "amqp"
ports = {"amqp": 5672, "amqps": 5671}
fields = ("exchange", "routing_key")
# AMQP 0-9-1 shortstr names: an exchange of letters, digits, hyphen, underscore, period or colon; "" is the
# default exchange (routing by queue name).
_EXCHANGE = re.compile(r"[A-Za-z0-9_.:\-]{0,255}")


def options_validate(given: dict, current: dict | None) -> dict:
    merged = {**(current or {}), **given}
    exchange = merged.get("exchange")
    if exchange is None or not isinstance(exchange, str) or not _EXCHANGE.fullmatch(exchange):
        raise brokers.DestinationRefused("exchange", "Required: an exchange name of at most 255 characters of "
                                                     "[A-Za-z0-9_.:-] (\"\" for the default exchange).")
    routing_key = brokers.name_validate(merged, "routing_key", required=True)
    return {"exchange": exchange, "routing_key": routing_key}


def _vhost(path: str) -> str:
    return unquote(path[1:]) if len(path) > 1 else "/"


class _Connection:
    def __init__(self, target: brokers.Target, address: str, timeout: float) -> None:
        parts = target.parts
        user, password = brokers.credentials(target)
        tls = None
        if parts.scheme == "amqps":
            tls = {"server_hostname": parts.hostname, "cert_reqs": ssl.CERT_REQUIRED}
        host = f"[{address}]" if ":" in address else address
        self._connection = amqp.Connection(
            host=f"{host}:{parts.port or ports[parts.scheme]}", userid=user or "guest", password=password or "guest",
            virtual_host=_vhost(parts.path), connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout,
            ssl=tls or False, client_properties={"product": "Herald"})
        self._connection.connect()
        self._channel = self._connection.channel()
        self._channel.confirm_select()
        self._returned: set[str] = set()
        self._answers: dict[int, bool] = {}  # publish number -> acked (True) or nacked, for the batch in hand
        # Confirms are taken by the channel's event handlers, never by a one-off `wait` callback: py-amqp drains
        # the socket inside basic_publish too (to see connection.blocked), where a `wait` callback would miss them.
        self._channel.events["basic_return"].add(self._on_return)
        self._channel.events["basic_ack"].add(lambda tag, multiple: self._on_confirm(tag, multiple, True))
        self._channel.events["basic_nack"].add(lambda tag, multiple: self._on_confirm(tag, multiple, False))
        self._exchange, self._routing_key = target.options["exchange"], target.options["routing_key"]
        self._tag = 0  # the last publish's number on this channel
        self._first = 1  # the batch in hand's first publish number

    def _on_return(self, exc, exchange, routing_key, message) -> None:
        self._returned.add(message.properties.get("message_id"))
        self._return_reason = str(exc)

    def _on_confirm(self, tag: int, multiple: bool, ok: bool) -> None:
        for number in (range(self._first, tag + 1) if multiple else (tag,)):
            self._answers.setdefault(number, ok)

    def publish(self, messages: list[brokers.Message], deadline: float) -> list[str | Exception]:
        first = self._first = self._tag + 1
        self._returned.clear()
        self._answers.clear()
        for message in messages:
            headers = {name: message.headers[name] for name in brokers.MESSAGE_HEADERS if name in message.headers}
            body = amqp.Message(message.body, content_type="application/json", message_id=headers["webhook-id"],
                                delivery_mode=2, application_headers=headers)
            self._channel.basic_publish(body, exchange=self._exchange, routing_key=self._routing_key, mandatory=True,
                                        timeout=max(deadline - time.monotonic(), 0.001))
            self._tag += 1
        answers = self._answers
        last = self._tag
        while len(answers) < len(messages):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timeout: the broker confirmed too few messages within the deadline")
            self._connection.drain_events(timeout=remaining)
        results: list[str | Exception] = []
        for tag, message in zip(range(first, last + 1), messages):
            if message.headers["webhook-id"] in self._returned:
                results.append(RuntimeError(f"amqp_returned: unroutable ({self._return_reason})"))
            elif not answers.get(tag):
                results.append(RuntimeError("amqp_nack: the broker refused the message"))
            else:
                results.append(f"confirmed by {self._exchange or '(default)'} / {self._routing_key}")
        return results

    def close(self) -> None:
        try:
            self._connection.close()
        except Exception:  # noqa: BLE001 - a dead connection's socket is closed below
            self._connection.collect()


def connect(target: brokers.Target, address: str, timeout: float) -> _Connection:
    return _Connection(target, address, timeout)


classify = brokers.classify  # delivered or not: a broker is never gone for good, and sets no Retry-After
