"""Where a test's deliveries arrive, for each destination kind: a real HTTP receiver, or a real broker on this
machine (RabbitMQ, Redis, NATS JetStream) read back by a consumer, behind a TCP proxy per endpoint that the
test can take down (connections refused) or make hang (accepted, never answered).

A scenario written against a Sink runs for every kind (the `sink` fixture of tests/conftest.py is
parametrised by kind): `endpoint_fields(path)` is what POST /endpoints takes for an endpoint of its own,
`wait_for` / `received` what arrived there (path, headers, body, arrival time), `down` / `up` / `hang` what
its destination does next.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid

from tests.receiver import Received as Arrived  # what arrived: path, headers, body, time (status 200)

AMQP = ("127.0.0.1", 5672)
REDIS = ("127.0.0.1", 6379)
NATS = ("127.0.0.1", 4222)
KINDS = ("http", "amqp", "redis_stream", "nats")


class Proxy:
    """A TCP proxy on 127.0.0.1 to `upstream`: forwards, refuses (accepts and closes at once) or hangs (accepts
    and never answers) its new connections; `cut()` closes the ones open."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.mode = "forward"
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            with self._lock:
                self._open.add(client)
            if self.mode == "hang":
                continue  # held open, never read or answered, until cut
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.add(server)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


class Sink:
    kind = ""

    def __init__(self) -> None:
        self._arrived: list[Arrived] = []
        self._changed = threading.Condition()

    def _add(self, arrived: Arrived) -> None:
        with self._changed:
            self._arrived.append(arrived)
            self._changed.notify_all()

    def received(self, path: str | None = None) -> list[Arrived]:
        with self._changed:
            return [a for a in self._arrived if path is None or a.path == path]

    def wait_for(self, count: int, path: str | None = None, timeout: float = 20.0) -> list[Arrived]:
        from tests.receiver import wait_for_count

        return wait_for_count(self._changed, lambda: [a for a in self._arrived if path is None or a.path == path],
                              count, timeout, f"messages at {path or 'any path'} ({self.kind})")

    def endpoint_fields(self, path: str = "/hook") -> dict:
        raise NotImplementedError

    def down(self, path: str) -> None:
        raise NotImplementedError

    def up(self, path: str) -> None:
        raise NotImplementedError

    def hang(self, path: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class HttpSink(Sink):
    """A real receiver (tests/receiver.py): down answers 500, hang answers after 10 s."""

    kind = "http"

    def __init__(self) -> None:
        super().__init__()
        from tests.receiver import Answer, Receiver

        self._answer = Answer
        self.receiver = Receiver()
        self.receiver.on_request = lambda r: self._add(r) if r.answered_ok else None

    def endpoint_fields(self, path: str = "/hook") -> dict:
        return {"url": self.receiver.url(path)}

    def down(self, path: str) -> None:
        self.receiver.path_default[path] = self._answer(status=500)

    def up(self, path: str) -> None:
        self.receiver.path_default.pop(path, None)

    def hang(self, path: str) -> None:
        self.receiver.path_default[path] = self._answer(delay=10)

    def close(self) -> None:
        self.receiver.close()


class _BrokerSink(Sink):
    """A broker behind a proxy per path; `_target(path)` names where that path's messages go on it."""

    upstream: tuple[str, int] = ("", 0)
    scheme = ""

    def __init__(self) -> None:
        super().__init__()
        self._proxies: dict[str, Proxy] = {}
        self._names: dict[str, str] = {}
        self._stop = threading.Event()
        self.prefix = f"herald-test-{uuid.uuid4().hex[:10]}"

    def name(self, path: str) -> str:
        if path not in self._names:
            self._names[path] = f"{self.prefix}{path.replace('/', '.')}"
            self._proxies[path] = Proxy(self.upstream)
            self._declare(path, self._names[path])
        return self._names[path]

    def port(self, path: str) -> int:
        self.name(path)
        return self._proxies[path].port

    def down(self, path: str) -> None:
        self.name(path)
        self._proxies[path].mode = "refuse"
        self._proxies[path].cut()

    def up(self, path: str) -> None:
        self.name(path)
        self._proxies[path].mode = "forward"

    def hang(self, path: str) -> None:
        self.name(path)
        self._proxies[path].mode = "hang"
        self._proxies[path].cut()

    def close(self) -> None:
        self._stop.set()
        for proxy in self._proxies.values():
            proxy.close()
        self._teardown()

    def _declare(self, path: str, name: str) -> None:
        raise NotImplementedError

    def _teardown(self) -> None:
        pass


class AmqpSink(_BrokerSink):
    """RabbitMQ: an exchange of its own, a queue per path bound by the path's routing key, a consumer."""

    kind = "amqp"
    upstream = AMQP

    def __init__(self) -> None:
        import amqp

        super().__init__()
        self._amqp = amqp
        self._admin = amqp.Connection(f"{AMQP[0]}:{AMQP[1]}", userid="guest", password="guest")
        self._admin.connect()
        self._channel = self._admin.channel()
        self.exchange = self.prefix
        self._channel.exchange_declare(self.exchange, "direct", durable=False, auto_delete=False)
        self._lock = threading.Lock()
        self._queues: list[str] = []
        threading.Thread(target=self._consume, daemon=True).start()

    def _declare(self, path: str, name: str) -> None:
        with self._lock:
            self._channel.queue_declare(name, durable=False, auto_delete=False)
            self._channel.queue_bind(name, self.exchange, routing_key=name)
            tag = self._channel.basic_consume(name, callback=lambda message, p=path: self._on_message(p, message),
                                              no_ack=True)
            self._queues.append((name, tag))

    def _on_message(self, path: str, message) -> None:
        headers = {k: (v.decode() if isinstance(v, bytes) else v)
                   for k, v in (message.properties.get("application_headers") or {}).items()}
        headers["message_id"] = message.properties.get("message_id")
        headers["content_type_property"] = message.properties.get("content_type")
        headers["delivery_mode"] = message.properties.get("delivery_mode")
        self._add(Arrived(path, headers, bytes(message.body), time.monotonic()))

    def _consume(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                try:
                    self._admin.drain_events(timeout=0.05)
                except socket.timeout:
                    pass
                except Exception:  # noqa: BLE001 - closed at teardown
                    return
            time.sleep(0.001)  # let _declare take the lock

    def refuse(self, path: str) -> None:
        """A second queue takes the path's routing key, full and refusing more (`reject-publish`): the broker
        nacks each publish (RabbitMQ confirms a message only once every queue it was routed to took it)."""
        full = self.name(path) + ".full"
        with self._lock:
            self._channel.queue_declare(full, durable=False, auto_delete=False,
                                        arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
            self._channel.queue_bind(full, self.exchange, routing_key=self.name(path))
            self._queues.append((full, None))

    def unbind(self, path: str) -> None:
        """No queue takes the path's routing key any more: a mandatory publish is returned."""
        with self._lock:
            self._channel.queue_unbind(self.name(path), self.exchange, routing_key=self.name(path))

    def endpoint_fields(self, path: str = "/hook") -> dict:
        return {"kind": "amqp", "url": f"amqp://guest:guest@127.0.0.1:{self.port(path)}/",
                "exchange": self.exchange, "routing_key": self.name(path)}

    def _teardown(self) -> None:
        with self._lock:
            for queue, tag in self._queues:
                if tag is not None:
                    self._channel.basic_cancel(tag)
                self._channel.queue_delete(queue)
            self._channel.exchange_delete(self.exchange)
            self._admin.close()


class RedisStreamSink(_BrokerSink):
    """Redis (the tests' own database, REDIS_URL's): a stream per path, read with XREAD."""

    kind = "redis_stream"
    upstream = REDIS

    def __init__(self) -> None:
        import os
        from urllib.parse import urlsplit

        import redis

        super().__init__()
        self.db = int((urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")).path.strip("/") or 0))
        self._client = redis.Redis(host=REDIS[0], port=REDIS[1], db=self.db)
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _declare(self, path: str, name: str) -> None:
        with self._lock:
            self._last[name] = "0-0"

    def _read(self) -> None:
        paths = {}
        while not self._stop.is_set():
            with self._lock:
                streams = dict(self._last)
                paths = {name: path for path, name in self._names.items()}
            if not streams:
                time.sleep(0.01)
                continue
            try:
                answer = self._client.xread(streams, block=50)
            except Exception:  # noqa: BLE001 - a stream made the wrong type on purpose, or teardown
                time.sleep(0.01)
                continue
            for name, entries in answer:
                name = name.decode()
                for entry_id, fields in entries:
                    with self._lock:
                        self._last[name] = entry_id.decode()
                    fields = {k.decode(): v for k, v in fields.items()}
                    body = fields.pop("body")
                    self._add(Arrived(paths[name], {k: v.decode() for k, v in fields.items()}, body,
                                      time.monotonic()))

    def entries(self, path: str) -> int:
        return self._client.xlen(self.name(path))

    def endpoint_fields(self, path: str = "/hook") -> dict:
        return {"kind": "redis_stream", "url": f"redis://127.0.0.1:{self.port(path)}/{self.db}",
                "stream": self.name(path)}

    def _teardown(self) -> None:
        if self._names:
            self._client.delete(*self._names.values())
        self._client.close()


class NatsSink(_BrokerSink):
    """NATS JetStream: a stream and a subject per path, read by a subscriber. A stream of its own each: JetStream
    de-duplicates by Nats-Msg-Id (the webhook-id) across a whole stream, so one event fanned out to two
    endpoints publishing into one stream is stored once (docs/api.md says so)."""

    kind = "nats"
    upstream = NATS

    def __init__(self) -> None:
        super().__init__()
        self._streams: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self._run(self._start())

    def _run(self, coroutine, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self) -> None:
        import nats

        self._nc = await nats.connect(f"nats://{NATS[0]}:{NATS[1]}")
        self._js = self._nc.jetstream()

    def stream(self, path: str = "/hook") -> str:
        self.name(path)
        return self._streams[path]

    def _declare(self, path: str, name: str) -> None:
        stream = self._streams[path] = name.replace("-", "_").replace(".", "_")

        async def subscribe():
            await self._js.add_stream(name=stream, subjects=[name], duplicate_window=120)
            async def on_message(message):
                headers = dict(message.headers or {})
                self._add(Arrived(path, headers, message.data, time.monotonic()))
                await message.ack()

            await self._js.subscribe(name, cb=on_message, stream=stream)

        self._run(subscribe())

    def stream_messages(self, path: str = "/hook") -> int:
        async def info():
            return (await self._js.stream_info(self.stream(path))).state.messages

        return self._run(info())

    def delete_stream(self, path: str = "/hook") -> None:
        """No stream takes the path's subject any more: a publish gets no responders."""
        self._run(self._js.delete_stream(self.stream(path)))

    def endpoint_fields(self, path: str = "/hook") -> dict:
        return {"kind": "nats", "url": f"nats://127.0.0.1:{self.port(path)}", "subject": self.name(path)}

    def _teardown(self) -> None:
        async def stop():
            for stream in self._streams.values():
                try:
                    await self._js.delete_stream(stream)
                except Exception:  # noqa: BLE001 - deleted by the test already
                    pass
            await self._nc.close()

        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)


SINKS = {"http": HttpSink, "amqp": AmqpSink, "redis_stream": RedisStreamSink, "nats": NatsSink}


@contextlib.contextmanager
def opened(kind: str):
    """A sink of `kind`, closed afterwards with this process's broker connections (an in-process engine's)."""
    from webhooks.delivery.destinations import brokers

    made = SINKS[kind]()
    try:
        yield made
    finally:
        brokers.pools_close()
        made.close()


def body_json(arrived: Arrived) -> dict:
    return json.loads(arrived.body)
