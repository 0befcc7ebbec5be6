"""`Herald`: every call of Herald's REST API as a method, for a tenant's own credential or a platform's.

    herald = Herald("https://hooks.example.com", token="hrld_…")
    event = herald.events.create("invoice.paid", {"invoice": "in_1"})
    for delivery in herald.deliveries.list(event=event["id"]):
        ...

A platform credential manages tenants (`herald.tenants`) and acts for one of them through
`herald.tenant("tnt_…" or its uid)`, which has the same `endpoints`, `events`, `deliveries` and
`portal_links`, plus `credentials`. Every write is sent with an `Idempotency-Key` and retried
safely (see `RetryPolicy`); errors are raised as the `APIError` subclass of their `code`.
"""
from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, Union
from urllib.parse import quote

import requests

from herald_client._http import Response, RetryInfo, RetryPolicy, Timeout, Transport
from herald_client.pagination import ListIterator
from herald_client.types import (Credential, Delivery, DeliveryDetail, DeliveryStatus, Endpoint, EndpointKind, Event,
                                 EventType,
                                 MessagePage, Ordering, PortalLink, Recovery, Signature, Tenant)

DEFAULT_TIMEOUT: Timeout = (5.0, 30.0)  # seconds to connect, seconds to wait for the answer


class _Omit(enum.Enum):
    OMIT = "OMIT"


OMIT = _Omit.OMIT
"""The default of every optional field of an update: not sent, so left as it is (None sends null)."""

Instant = Union[datetime, str]
Names = list[str]  # event types, channels (a class with a `list` method cannot say `list[str]` in its body)


def _segment(value: str) -> str:
    """One path segment, escaped (a tenant uid may hold `:`). `.` and `..` cannot be sent as a segment
    (HTTP libraries and proxies resolve them): address such a tenant by its `tnt_…` id."""
    if not isinstance(value, str) or not value or set(value) == {"."}:
        raise ValueError(f"not an id that can be used in a URL path: {value!r}")
    return quote(value, safe="")


def _instant(value: Instant | None) -> str | None:
    """A filter's datetime as ISO 8601 in UTC (a naive datetime is taken as UTC); a string as it is."""
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _fields(**values: Any) -> dict[str, Any]:
    """The body of an update: every field that was given (OMIT ones are left out)."""
    return {name: value for name, value in values.items() if value is not OMIT}


class _Resource:
    """Calls under one path prefix: `""` for a tenant credential, `tenants/{tenant}/` for a platform's."""

    def __init__(self, transport: Transport, prefix: str) -> None:
        self._transport = transport
        self._prefix = prefix

    def _call(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
              idempotency_key: str | None = None) -> Any:
        return self._transport.request(method, self._prefix + path, json_body=body, params=params,
                                       idempotency_key=idempotency_key).json()

    def _list(self, path: str, params: Mapping[str, Any], limit: int | None, cursor: str | None) -> ListIterator[Any]:
        return ListIterator(lambda query: self._call("GET", path, params=query), params, limit=limit, cursor=cursor)


class Endpoints(_Resource):
    """The tenant's webhook endpoints."""

    def create(self, url: str | None = None, *, event_types: list[str] | None = None,
               channels: list[str] | None = None,
               description: str | None = None, max_in_flight: int | None = None,
               throttle_rate: int | None = None, ordering: Ordering | None = None,
               kind: EndpointKind | None = None,
               headers: Mapping[str, str] | None = None, auth: Mapping[str, Any] | None = None,
               client_certificate: Mapping[str, str] | None = None,
               signature: Signature | None = None, filter: Mapping[str, Any] | None = None,  # noqa: A002
               exchange: str | None = None, routing_key: str | None = None, stream: str | None = None,
               maxlen: int | None = None, subject: str | None = None,
               idempotency_key: str | None = None) -> Endpoint:
        """`POST endpoints`: a new endpoint (its signing secret: `secret(id)`). Fields left None take
        Herald's defaults: every event type, no channels, the deployment's in-flight cap, no throttle,
        unordered, no extra headers, auth or client certificate (`headers`: {name: value};
        `auth`: {"type": "basic"|"bearer"|"oauth2_client_credentials", …}; `client_certificate`:
        {"certificate", "private_key"} in PEM; see docs/api.md). `kind="poll"` (and no `url`) makes a
        polling endpoint: read it with `messages` (it takes no headers, auth or client certificate).
        `signature="v1a"` signs with ed25519 (`secret(id)` is then the `whpk_` public key); `filter` is a
        payload filter (docs/api.md). `kind="amqp"` (with `exchange`, `routing_key`), `"redis_stream"` (`stream`,
        `maxlen`) or `"nats"` (`subject`), with the broker's `url` and its credentials in it: a message broker."""
        body = {name: value for name, value in {
            "exchange": exchange, "routing_key": routing_key, "stream": stream, "maxlen": maxlen, "subject": subject,
            "signature": signature, "filter": dict(filter) if filter is not None else None,
            "kind": kind, "url": url, "event_types": event_types, "channels": channels, "description": description,
            "max_in_flight": max_in_flight, "throttle_rate": throttle_rate, "ordering": ordering,
            "headers": dict(headers) if headers is not None else None,
            "auth": dict(auth) if auth is not None else None,
            "client_certificate": dict(client_certificate) if client_certificate is not None else None,
        }.items() if value is not None}
        result: Endpoint = self._call("POST", "endpoints", body=body, idempotency_key=idempotency_key)
        return result

    def list(self, *, limit: int | None = None, cursor: str | None = None) -> ListIterator[Endpoint]:
        """`GET endpoints`: every endpoint, newest first, page by page as the iteration goes."""
        return self._list("endpoints", {}, limit, cursor)

    def get(self, endpoint_id: str) -> Endpoint:
        """`GET endpoints/{id}`: one endpoint, with its health."""
        result: Endpoint = self._call("GET", f"endpoints/{_segment(endpoint_id)}")
        return result

    def secret(self, endpoint_id: str) -> str:
        """`GET endpoints/{id}/secret`: what to verify its webhooks with: the current signing secret
        (`whsec_…`), or for a v1a endpoint its public key (`whpk_…`)."""
        shown = self._call("GET", f"endpoints/{_segment(endpoint_id)}/secret")
        return str(shown["secret"] if "secret" in shown else shown["public_key"])

    def update(self, endpoint_id: str, *, url: str | _Omit = OMIT, event_types: Names | _Omit = OMIT,
               channels: Names | _Omit = OMIT, description: str | _Omit = OMIT,
               enabled: bool | _Omit = OMIT, max_in_flight: int | None | _Omit = OMIT,
               throttle_rate: int | None | _Omit = OMIT, ordering: Ordering | _Omit = OMIT,
               headers: Mapping[str, str] | None | _Omit = OMIT, auth: Mapping[str, Any] | None | _Omit = OMIT,
               client_certificate: Mapping[str, str] | None | _Omit = OMIT,
               signature: Signature | _Omit = OMIT, filter: Mapping[str, Any] | None | _Omit = OMIT,  # noqa: A002
               exchange: str | _Omit = OMIT, routing_key: str | _Omit = OMIT, stream: str | _Omit = OMIT,
               maxlen: int | None | _Omit = OMIT, subject: str | _Omit = OMIT,
               idempotency_key: str | None = None) -> Endpoint:
        """`PATCH endpoints/{id}`: change the fields given; the others stay (a broker's fields among them). `max_in_flight=None` goes
        back to the deployment's default, `throttle_rate=None` removes the throttle; `headers`, `auth` and
        `client_certificate` replace the whole current value (None removes it)."""
        body = _fields(url=url, event_types=event_types, channels=channels, description=description,
                       enabled=enabled, max_in_flight=max_in_flight, throttle_rate=throttle_rate, ordering=ordering,
                       headers=headers if headers is None or headers is OMIT else dict(headers),
                       auth=auth if auth is None or auth is OMIT else dict(auth),
                       client_certificate=client_certificate if client_certificate is None or client_certificate is OMIT
                       else dict(client_certificate), signature=signature,
                       filter=filter if filter is None or filter is OMIT else dict(filter), exchange=exchange,
                       routing_key=routing_key, stream=stream, maxlen=maxlen, subject=subject)
        result: Endpoint = self._call("PATCH", f"endpoints/{_segment(endpoint_id)}", body=body,
                                      idempotency_key=idempotency_key)
        return result

    def delete(self, endpoint_id: str) -> None:
        """`DELETE endpoints/{id}`: its pending deliveries are cancelled."""
        self._call("DELETE", f"endpoints/{_segment(endpoint_id)}")

    def rotate_secret(self, endpoint_id: str, *, idempotency_key: str | None = None) -> Endpoint:
        """`POST endpoints/{id}/rotate-secret`: a new signing secret (read it with `secret(id)`); the
        previous one keeps signing, alongside, for 24 hours."""
        result: Endpoint = self._call("POST", f"endpoints/{_segment(endpoint_id)}/rotate-secret",
                                      idempotency_key=idempotency_key)
        return result

    def messages(self, endpoint_id: str, *, after: str | None = None, limit: int | None = None,
                 wait: float | None = None) -> MessagePage:
        """`GET endpoints/{id}/messages`: a poll endpoint's next messages. `after` (a `next_cursor` it
        returned) acknowledges every message served up to it; with nothing new, the answer waits up to
        `wait` seconds (at most 30: the read timeout is made longer than that for this call)."""
        timeout = (5.0, (wait or 0) + 30.0)
        result: MessagePage = self._transport.request(
            "GET", self._prefix + f"endpoints/{_segment(endpoint_id)}/messages",
            params={"after": after, "limit": limit, "wait": wait}, timeout=timeout).json()
        return result

    def test(self, endpoint_id: str, *, idempotency_key: str | None = None) -> Event:
        """`POST endpoints/{id}/test`: send a `herald.test` event to this endpoint only."""
        result: Event = self._call("POST", f"endpoints/{_segment(endpoint_id)}/test", idempotency_key=idempotency_key)
        return result


    def recover(self, endpoint_id: str, since: Instant, *, until: Instant | None = None,
                idempotency_key: str | None = None) -> Recovery:
        """`POST endpoints/{id}/recover`: resend, in the background and in event order, every failed
        delivery of this endpoint whose event was created in [since, until) (until None: up to now).
        Follow it with `recoveries.get(id)`."""
        result: Recovery = self._call("POST", f"endpoints/{_segment(endpoint_id)}/recover",
                                      body={"since": _instant(since), "until": _instant(until)},
                                      idempotency_key=idempotency_key)
        return result


class Recoveries(_Resource):
    """Recoveries of endpoints' failed deliveries (`endpoints.recover` starts one)."""

    def get(self, recovery_id: str) -> Recovery:
        """`GET recoveries/{id}`: its progress; `status` ends as `completed`."""
        result: Recovery = self._call("GET", f"recoveries/{_segment(recovery_id)}")
        return result


class Events(_Resource):
    """The tenant's events: post one, list them, read one with its deliveries' statuses."""

    def create(self, type: str, data: Any, *, channels: list[str] | None = None,  # noqa: A002 - the API's name
               idempotency_key: str | None = None) -> Event:
        """`POST events`: record the event once and fan it out to every matching endpoint.

        Pass an `idempotency_key` derived from your own operation (e.g. `f"invoice-{id}-paid"`) to make
        a retry by your own code, even from another process, a replay instead of a second event.
        """
        body: dict[str, Any] = {"type": type, "data": data}
        if channels:
            body["channels"] = channels
        result: Event = self._call("POST", "events", body=body, idempotency_key=idempotency_key)
        return result

    def send_batch(self, events: list[Mapping[str, Any]], *, idempotency_key: str | None = None) -> list[Event]:
        """`POST events/batch`: record 1 to 500 events (`{"type", "data", "channels"?}` each) in one request
        under one `Idempotency-Key`, all or nothing; the events as `create` returns them, in the order sent.

        One invalid event refuses the whole batch with `ValidationError`, whose `errors` are keyed by JSON
        pointer (`/events/3/data/amount`); nothing is stored. A retry with the same key and the same events
        is a replay.
        """
        body = {"events": [{name: value for name, value in event.items() if name != "channels" or value}
                           for event in events]}
        result: dict[str, list[Event]] = self._call("POST", "events/batch", body=body,
                                                     idempotency_key=idempotency_key)
        return result["data"]

    def list(self, *, type: str | None = None, created_after: Instant | None = None,  # noqa: A002
             created_before: Instant | None = None, limit: int | None = None,
             cursor: str | None = None) -> ListIterator[Event]:
        """`GET events`: newest first, filtered by type and creation time (`created_after` inclusive)."""
        return self._list("events", {"type": type, "created_after": _instant(created_after),
                                     "created_before": _instant(created_before)}, limit, cursor)

    def get(self, event_id: str) -> Event:
        """`GET events/{id}`: one event with the current status of each of its deliveries."""
        result: Event = self._call("GET", f"events/{_segment(event_id)}")
        return result


class Deliveries(_Resource):
    """One delivery per (event, endpoint): its status and every attempt."""

    def list(self, *, status: DeliveryStatus | None = None, endpoint: str | None = None, event: str | None = None,
             created_after: Instant | None = None, created_before: Instant | None = None,
             limit: int | None = None, cursor: str | None = None) -> ListIterator[Delivery]:
        """`GET deliveries`: newest first, filtered by status, endpoint id, event id and creation time."""
        return self._list("deliveries", {"status": status, "endpoint": endpoint, "event": event,
                                         "created_after": _instant(created_after),
                                         "created_before": _instant(created_before)}, limit, cursor)

    def get(self, delivery_id: str) -> DeliveryDetail:
        """`GET deliveries/{id}`: one delivery with every attempt it made."""
        result: DeliveryDetail = self._call("GET", f"deliveries/{_segment(delivery_id)}")
        return result

    def retry(self, delivery_id: str, *, idempotency_key: str | None = None) -> Delivery:
        """`POST deliveries/{id}/retry`: send a failed or succeeded delivery again now (a pending one is
        left as it is)."""
        result: Delivery = self._call("POST", f"deliveries/{_segment(delivery_id)}/retry",
                                      idempotency_key=idempotency_key)
        return result


class PortalLinks(_Resource):
    """One-time links to the tenant's portal."""

    def create(self, *, theme: Mapping[str, str] | None = None, idempotency_key: str | None = None) -> PortalLink:
        """`POST portal-links`: a link the tenant's people open once, before `expires_at`; `theme`
        ({name?, logo_url?, accent?}) is shown on that session's pages."""
        body = {"theme": dict(theme)} if theme is not None else None
        result: PortalLink = self._call("POST", "portal-links", body=body, idempotency_key=idempotency_key)
        return result


class Credentials(_Resource):
    """A tenant's credentials, made and revoked by the platform."""

    def create(self, *, idempotency_key: str | None = None) -> Credential:
        """`POST tenants/{tenant}/credentials`: a tenant credential; its `token` is shown only this once."""
        result: Credential = self._call("POST", "credentials", idempotency_key=idempotency_key)
        return result

    def revoke(self, credential_id: str) -> None:
        """`DELETE tenants/{tenant}/credentials/{id}`: the token stops working, and the portal sessions
        it opened end."""
        self._call("DELETE", f"credentials/{_segment(credential_id)}")


class Tenants(_Resource):
    """The platform's customers (a platform credential only; a tenant credential gets `Forbidden`)."""

    def create(self, name: str, *, uid: str | None = None, max_endpoints: int | None = None,
               metadata: dict[str, Any] | None = None, delivery_weight: int | None = None,
               idempotency_key: str | None = None) -> Tenant:
        """`POST tenants`. `uid` is your own id for the customer (unique: a taken one is `Conflict`);
        `metadata` a JSON object of at most 4 KiB; `delivery_weight` (1-100, default 1) its share of the
        delivery workers while others have deliveries waiting too."""
        body = {name_: value for name_, value in {"name": name, "uid": uid, "max_endpoints": max_endpoints,
                                                   "metadata": metadata, "delivery_weight": delivery_weight}.items()
                if value is not None}
        result: Tenant = self._call("POST", "tenants", body=body, idempotency_key=idempotency_key)
        return result

    def list(self, *, uid: str | None = None, limit: int | None = None,
             cursor: str | None = None) -> ListIterator[Tenant]:
        """`GET tenants`: every tenant, newest first (`uid=` finds yours by your own id)."""
        return self._list("tenants", {"uid": uid}, limit, cursor)

    def get(self, tenant: str) -> Tenant:
        """`GET tenants/{tenant}` by id (`tnt_…`) or uid."""
        result: Tenant = self._call("GET", f"tenants/{_segment(tenant)}")
        return result

    def update(self, tenant: str, *, name: str | _Omit = OMIT, metadata: dict[str, Any] | _Omit = OMIT,
               max_endpoints: int | None | _Omit = OMIT, delivery_weight: int | _Omit = OMIT,
               idempotency_key: str | None = None) -> Tenant:
        """`PATCH tenants/{tenant}`: change the fields given (`max_endpoints=None`: the deployment's default)."""
        result: Tenant = self._call("PATCH", f"tenants/{_segment(tenant)}", idempotency_key=idempotency_key,
                                    body=_fields(name=name, metadata=metadata, max_endpoints=max_endpoints,
                                                 delivery_weight=delivery_weight))
        return result

    def delete(self, tenant: str) -> None:
        """`DELETE tenants/{tenant}` (202): at once its credentials stop working and nothing more is
        delivered; everything it owns is then erased in the background."""
        self._call("DELETE", f"tenants/{_segment(tenant)}")


class EventTypes(_Resource):
    """The deployment's event-type catalog: every credential reads the list; a platform credential writes it
    and reads one entry (a tenant credential gets `Forbidden`)."""

    def create(self, name: str, *, description: str | None = None, schema: dict[str, Any] | None = None,
               example: Any = None, idempotency_key: str | None = None) -> EventType:
        """`POST event-types`: a type, with the JSON Schema its events' `data` must match (a taken name is
        `Conflict`; a schema that is not one, or an example that does not match it, `ValidationError`)."""
        body = {key: value for key, value in {"name": name, "description": description, "schema": schema,
                                              "example": example}.items() if value is not None}
        result: EventType = self._call("POST", "event-types", body=body, idempotency_key=idempotency_key)
        return result

    def list(self, *, limit: int | None = None, cursor: str | None = None) -> ListIterator[EventType]:
        """`GET event-types`: the catalog, newest first."""
        return self._list("event-types", {}, limit, cursor)

    def get(self, name: str) -> EventType:
        """`GET event-types/{name}`."""
        result: EventType = self._call("GET", f"event-types/{_segment(name)}")
        return result

    def update(self, name: str, *, description: str | _Omit = OMIT, schema: dict[str, Any] | None | _Omit = OMIT,
               example: Any = OMIT, idempotency_key: str | None = None) -> EventType:
        """`PATCH event-types/{name}`: change the fields given (`schema=None` removes the check)."""
        result: EventType = self._call("PATCH", f"event-types/{_segment(name)}", idempotency_key=idempotency_key,
                                       body=_fields(description=description, schema=schema, example=example))
        return result

    def delete(self, name: str) -> None:
        """`DELETE event-types/{name}`: events of that type are accepted unchecked from then on."""
        self._call("DELETE", f"event-types/{_segment(name)}")


class _TenantCalls:
    """The calls that act on one tenant's objects."""

    def __init__(self, transport: Transport, prefix: str) -> None:
        self.endpoints = Endpoints(transport, prefix)
        self.events = Events(transport, prefix)
        self.deliveries = Deliveries(transport, prefix)
        self.portal_links = PortalLinks(transport, prefix)
        self.recoveries = Recoveries(transport, prefix)


class TenantScope(_TenantCalls):
    """A platform acting for one tenant: `/api/v1/tenants/{tenant}/…` (`Herald.tenant(...)` makes one)."""

    def __init__(self, transport: Transport, tenant: str) -> None:
        self.tenant = tenant
        prefix = f"tenants/{_segment(tenant)}/"
        super().__init__(transport, prefix)
        self.credentials = Credentials(transport, prefix)
        self._tenants = Tenants(transport, "")

    def get(self) -> Tenant:
        """This tenant (`tenants.get`)."""
        return self._tenants.get(self.tenant)

    def update(self, *, name: str | _Omit = OMIT, metadata: dict[str, Any] | _Omit = OMIT,
               max_endpoints: int | None | _Omit = OMIT, delivery_weight: int | _Omit = OMIT,
               idempotency_key: str | None = None) -> Tenant:
        """Change this tenant (`tenants.update`)."""
        return self._tenants.update(self.tenant, name=name, metadata=metadata, max_endpoints=max_endpoints,
                                    delivery_weight=delivery_weight, idempotency_key=idempotency_key)

    def delete(self) -> None:
        """Delete this tenant and erase everything it owns (`tenants.delete`)."""
        self._tenants.delete(self.tenant)


class Herald(_TenantCalls):
    """A client of one Herald deployment with one credential.

    With a tenant credential, `endpoints`, `events`, `deliveries` and `portal_links` act on its tenant.
    With a platform credential, `tenants` manages tenants and `tenant(t)` acts for one of them.

    `timeout` is seconds per attempt (a number, or `(connect, read)`); `retry` says how often and how
    long apart a call is retried; `on_retry` is called before each retry (the default logs it on the
    `herald_client` logger at INFO); `session` a `requests.Session` of your own (proxies, TLS, adapters),
    which `close()` then leaves open. Thread-safe as far as the session is: one client per thread is
    the safe choice with requests.
    """

    def __init__(self, base_url: str, token: str, *, timeout: Timeout = DEFAULT_TIMEOUT,
                 retry: RetryPolicy | None = None, on_retry: Callable[[RetryInfo], None] | None = None,
                 session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, e.g. https://hooks.example.com, not {base_url!r}")
        if not token:
            raise ValueError("a token is required")
        self._transport = Transport(base_url, token, retry=retry or RetryPolicy(), timeout=timeout,
                                    session=session, on_retry=on_retry)
        super().__init__(self._transport, "")
        self.tenants = Tenants(self._transport, "")
        self.event_types = EventTypes(self._transport, "")

    @classmethod
    def from_env(cls, **options: Any) -> Herald:
        """A client for `$HERALD_URL` (default `http://127.0.0.1:8000`) with `$HERALD_TOKEN`."""
        token = os.environ.get("HERALD_TOKEN", "")
        if not token:
            raise ValueError("HERALD_TOKEN is not set")
        return cls(os.environ.get("HERALD_URL") or "http://127.0.0.1:8000", token, **options)

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    def tenant(self, tenant: str) -> TenantScope:
        """Act for one tenant, by its id (`tnt_…`) or your uid for it (a platform credential only)."""
        return TenantScope(self._transport, tenant)

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                idempotency_key: str | None = None, timeout: Timeout | None = None,
                retry: RetryPolicy | None = None) -> Response:
        """Any call, with the same keys, retries and errors as the methods: for what they do not cover
        yet. `path` is relative to `/api/v1/` (`"events"`) unless it starts with `/` (`"/healthz"`);
        `timeout` and `retry` override the client's for this call (a long poll needs a longer read
        timeout). Returns the final 2xx `Response` (`.json()`, `.status`, `.replayed`)."""
        return self._transport.request(method, path, json_body=json, params=params, idempotency_key=idempotency_key,
                                       timeout=timeout, retry=retry)

    def close(self) -> None:
        """Close the connection pool (unless the session was given)."""
        self._transport.close()

    def __enter__(self) -> Herald:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
