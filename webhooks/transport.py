"""One HTTP POST delivery attempt: SSRF-filtered, no redirects, bounded in time and size."""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from requests_hardened import Config, HTTPSession
from requests_hardened.ip_filter import InvalidIPAddress
from requests_hardened.ip_filter_adapter import IPFilterAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

EXCERPT_LIMIT = 4096
_MAX_ERROR_CHARS = 200

# Ranges that ipaddress does not flag as non-global (or did not in every CPython 3.11
# patch release) but that must never be reachable from a webhook sender.
_BLOCKED_NETWORKS: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
    ipaddress.ip_network(net)
    for net in (
        "100.64.0.0/10",  # CGNAT shared address space
        "192.0.0.0/24",  # IETF protocol assignments
        "192.88.99.0/24",  # 6to4 relay anycast
        "198.18.0.0/15",  # benchmarking
        "64:ff9b::/96",  # NAT64, embeds IPv4 addresses
        "64:ff9b:1::/48",  # local-use NAT64
        "2001:20::/28",  # ORCHIDv2
        "2002::/16",  # 6to4, embeds IPv4 addresses
        "5f00::/16",  # IPv6 segment routing
        "3fff::/20",  # documentation
        "fec0::/10",  # deprecated site-local
    )
)


def is_public_address(ip: str) -> bool:
    """True only for a globally routable unicast IP (never loopback, private, CGNAT, ...)."""
    try:
        addr = ipaddress.ip_address(ip.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and (
        addr.ipv4_mapped is not None or addr.sixtofour is not None or addr.teredo is not None
    ):
        return False
    if (
        not addr.is_global
        or addr.is_private
        or addr.is_loopback
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr.is_unspecified
    ):
        return False
    return not any(addr in net for net in _BLOCKED_NETWORKS)


def _resolve(host: str, port: int) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]  # a literal: no lookup
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check_url_host(url: str) -> None:
    """Raise ValueError unless ``url`` is http(s) and its host resolves only to public addresses."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL scheme must be http or https, not {parts.scheme!r}")
    if not host:
        raise ValueError(f"URL {url!r} has no host")
    default_port = 443 if parts.scheme == "https" else 80
    blocked = [ip for ip in _resolve(host, port or default_port) if not is_public_address(ip)]
    if blocked:
        raise ValueError(
            f"host {host!r} resolves to non-public address {blocked[0]}; "
            "webhook endpoints must be reachable on the public internet"
        )


@dataclass(frozen=True)
class AttemptResult:
    """Outcome of one delivery attempt; ``error`` is empty when the request completed."""

    status: int | None
    body: str
    duration_ms: int
    error: str
    retry_after: str | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.error


class BlockedAddress(InvalidIPAddress):
    """The destination resolved to an address that is not public."""


# -- whole-attempt deadline -------------------------------------------------------------
#
# requests' timeouts bound each socket operation, not the attempt: a receiver dripping
# one byte per second would hold a worker forever. A watchdog thread shuts the socket of
# the in-flight connection down once the budget is spent, which unblocks the read.

_inflight = threading.local()


def _shutdown_socket(conn: Any) -> bool:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return False
    try:
        # The plain socket method, also for an SSLSocket: only the fd is shut down.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass
    return True


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._conn: Any = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="webhook-deadline", daemon=True)

    def __enter__(self) -> _Deadline:
        _inflight.deadline = self
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        _inflight.deadline = None

    def attach(self, conn: Any) -> None:
        with self._lock:
            self._conn = conn
            expired = self.expired
        if expired:
            _shutdown_socket(conn)

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        with self._lock:
            self.expired = True
        # Until the socket exists (connect is bounded by the connect timeout), keep trying.
        while not self._done.is_set():
            with self._lock:
                conn = self._conn
            if conn is not None and _shutdown_socket(conn):
                return
            self._done.wait(0.05)


class _TrackingPoolMixin:
    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        deadline = getattr(_inflight, "deadline", None)
        if deadline is not None:
            deadline.attach(conn)
        return conn


class _TrackingHTTPConnectionPool(_TrackingPoolMixin, HTTPConnectionPool):
    pass


class _TrackingHTTPSConnectionPool(_TrackingPoolMixin, HTTPSConnectionPool):
    pass


class _TrackingAdapterMixin:
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)  # type: ignore[misc]
        self.poolmanager.pool_classes_by_scheme = {  # type: ignore[attr-defined]
            "http": _TrackingHTTPConnectionPool,
            "https": _TrackingHTTPSConnectionPool,
        }


class _OpenAdapter(_TrackingAdapterMixin, HTTPAdapter):
    """Any destination (allow_private_networks=True)."""


class _FilteringAdapter(_TrackingAdapterMixin, IPFilterAdapter):
    """requests-hardened's filter: resolves at request time, refuses private IPs, pins the IP."""

    def build_connection_pool_key_attributes(self, request, verify, cert=None):  # type: ignore[no-untyped-def]
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
        )
        # The pool connects to exactly this resolved, pinned IP: apply our stricter check too.
        pinned = host_params["host"]
        if not is_public_address(pinned):
            raise BlockedAddress(pinned.strip("[]"))
        return host_params, pool_kwargs


# -- per-process sessions ---------------------------------------------------------------

_sessions: dict[tuple[int, bool], requests.Session] = {}
_sessions_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _sessions_lock
    _sessions_lock = threading.Lock()
    _sessions.clear()  # never share the parent's sockets with a forked child


os.register_at_fork(after_in_child=_reset_after_fork)


def _new_session(allow_private_networks: bool) -> requests.Session:
    session = HTTPSession(
        Config(
            ip_filter_enable=False,  # filtering adapters are mounted below
            ip_filter_allow_loopback_ips=False,
            never_redirect=True,
            default_timeout=None,  # send() always passes one
        )
    )
    session.trust_env = False  # no proxies or .netrc credentials from the environment
    session.headers["Accept-Encoding"] = "identity"  # the excerpt is read raw
    if allow_private_networks:
        session.mount("http://", _OpenAdapter())
        session.mount("https://", _OpenAdapter())
    else:
        session.mount("http://", _FilteringAdapter(is_https_proto=False))
        session.mount("https://", _FilteringAdapter(is_https_proto=True))
    return session


def _session(allow_private_networks: bool) -> requests.Session:
    key = (os.getpid(), allow_private_networks)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            for stale in [k for k in _sessions if k[0] != key[0]]:
                del _sessions[stale]
            session = _sessions[key] = _new_session(allow_private_networks)
        return session


# -- the attempt ------------------------------------------------------------------------


def _read_excerpt(raw: Any, into: bytearray) -> None:
    # Read to EOF (so a keep-alive connection goes back to the pool) or one byte past the
    # limit (the rest is not wanted: the connection is then closed, not reused).
    while len(into) <= EXCERPT_LIMIT:
        chunk = raw.read(EXCERPT_LIMIT + 1 - len(into), decode_content=False)
        if not chunk:
            return
        into += chunk


def _reason(exc: BaseException) -> str:
    """The most specific OS-level message in the exception's chain, else its own text."""
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return str(current)
        linked = [getattr(current, "reason", None), current.__cause__, current.__context__]
        linked += list(current.args)
        queue.extend(e for e in linked if isinstance(e, BaseException))
    return str(exc) or type(exc).__name__


def _describe_failure(exc: BaseException, deadline: _Deadline) -> str:
    if isinstance(exc, InvalidIPAddress):
        return f"blocked_address: {exc} is not a public address"
    if deadline.expired:
        return f"timeout: deadline of {deadline.seconds:g}s exceeded"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"timeout: connect timed out after {deadline.seconds:g}s"
    if isinstance(exc, (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)):
        return f"timeout: read timed out after {deadline.seconds:g}s"
    if isinstance(exc, (requests.exceptions.SSLError, urllib3.exceptions.SSLError)):
        message = f"tls_error: {_reason(exc)}"
    elif isinstance(
        exc,
        (
            requests.exceptions.InvalidURL,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema,
            urllib3.exceptions.LocationValueError,
        ),
    ):
        message = f"invalid_url: {exc}"
    elif isinstance(
        exc,
        (
            requests.ConnectionError,
            requests.exceptions.ChunkedEncodingError,
            urllib3.exceptions.ProtocolError,
            http.client.HTTPException,
            OSError,
        ),
    ):
        message = f"connection_error: {_reason(exc)}"
    elif isinstance(exc, requests.RequestException):
        message = f"request_error: {_reason(exc)}"
    else:
        message = f"unexpected_error: {type(exc).__name__}: {exc}"
    return message[:_MAX_ERROR_CHARS]


def send(
    *,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    allow_private_networks: bool,
) -> AttemptResult:
    """POST ``body`` to ``url`` once; every failure is reported in the result, never raised.

    ``timeout`` bounds connecting, each read, and the whole attempt. Redirects are not
    followed (a 3xx is a failure). Unless ``allow_private_networks``, the host is resolved
    when connecting and any non-public address is refused (so DNS rebinding cannot reach
    internal services).
    """
    started = time.monotonic()
    status: int | None = None
    retry_after: str | None = None
    excerpt = bytearray()
    error = ""
    with _Deadline(timeout) as deadline:
        try:
            response = _session(allow_private_networks).post(
                url,
                data=body,
                headers=dict(headers),
                timeout=(timeout, timeout),
                allow_redirects=False,
                stream=True,
            )
            try:
                status = response.status_code
                retry_after = response.headers.get("Retry-After")
                _read_excerpt(response.raw, excerpt)
            finally:
                response.close()
        except Exception as exc:  # noqa: BLE001 -- a failed attempt is a result, not an error
            error = _describe_failure(exc, deadline)
    duration_ms = int((time.monotonic() - started) * 1000)
    if not error and status is not None and 300 <= status < 400:
        error = "redirect_not_followed"
    return AttemptResult(
        status=status,
        body=bytes(excerpt[:EXCERPT_LIMIT]).decode("utf-8", errors="replace"),
        duration_ms=duration_ms,
        error=error,
        retry_after=retry_after,
    )
