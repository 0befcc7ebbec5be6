"""One HTTP POST delivery attempt on libcurl: SSRF-checked at connect time, no redirects, bounded in time and size.

libcurl (through pycurl) is used rather than requests/urllib3 for three reasons, each measured:
- `TIMEOUT_MS` bounds the whole attempt, DNS resolution included (a threaded resolver), where
  urllib3's and httpx's "total" timeouts let a receiver that drips one byte at a time run on;
- `OPENSOCKETFUNCTION` sees every resolved address just before the socket is opened, so a non-public
  address is refused at connect time whatever DNS answered when the endpoint was created;
- it releases the GIL for the whole transfer and costs about 0.2 ms of CPU per request against
  1.6 ms for requests, which is what lets one worker process keep 100 attempts in flight.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import certifi
import idna
import pycurl

from webhooks.delivery.addresses import check_url_host, is_public_address, resolve as _resolve  # noqa: F401 - the URL checks' home
from webhooks.delivery.destinations.base import AttemptResult

EXCERPT_LIMIT = 4096
_MAX_ERROR_CHARS = 200

# -- one libcurl handle per thread ----------------------------------------------------------
#
# A handle keeps its connections alive between attempts, so an endpoint that is sent to often is
# not paying for a TCP (and TLS) handshake each time. Handles are never shared between threads, and
# a forked child starts with none of its parent's sockets.

_local = threading.local()


def thread_handle() -> pycurl.Curl:
    """This thread's libcurl handle, reset (its connection cache kept)."""
    return _handle()


def _handle() -> pycurl.Curl:
    curl = getattr(_local, "curl", None)
    if curl is None or _local.pid != os.getpid():
        curl = _local.curl = pycurl.Curl()
        _local.pid = os.getpid()
    else:
        curl.reset()  # options back to defaults; the connection cache stays
    return curl


# libcurl's error codes (CURLE_*) for TLS trouble: handshake, certificates, pinning, ECH.
_TLS_ERRORS = frozenset({35, 51, 53, 54, 58, 59, 60, 64, 66, 77, 80, 82, 83, 90, 91, 98})
_URL_ERRORS = frozenset({pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_URL_MALFORMAT})


def _describe_failure(code: int, message: str, os_errno: int, timeout: float, blocked: list[str]) -> str:
    if blocked:
        return f"blocked_address: {blocked[0]} is not a public address"
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return f"timeout: deadline of {timeout:g}s exceeded ({message})"[:_MAX_ERROR_CHARS]
    if code in _TLS_ERRORS:
        kind = "tls_error"
    elif code in _URL_ERRORS:
        kind = "invalid_url"
    else:
        kind = "connection_error"
    if os_errno:  # "Connection refused" says more than libcurl's "Could not connect to server"
        message = f"{os.strerror(os_errno)} ({message})"
    return f"{kind}: {message}"[:_MAX_ERROR_CHARS]


def ascii_url(url: str) -> str:
    """The URL as libcurl takes it: an internationalised host in its IDNA form (UTS #46), other non-ASCII
    characters of the path and query percent-encoded as UTF-8. An ASCII URL is returned unchanged."""
    if url.isascii():
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host.isascii():
        host = idna.encode(host, uts46=True).decode("ascii")
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if parts.username is not None:
        userinfo = quote(parts.username, safe="") + ("" if parts.password is None else ":" + quote(parts.password, safe=""))
        netloc = f"{userinfo}@{netloc}"
    keep = "/%:@!$&'()*+,;=~-._?"
    return urlunsplit((parts.scheme, netloc, quote(parts.path, safe=keep), quote(parts.query, safe=keep + "="),
                       quote(parts.fragment, safe=keep)))


# CURLAUTH_BEARER (libcurl 7.61+), which pycurl does not name.
_HTTPAUTH_BEARER = getattr(pycurl, "HTTPAUTH_BEARER", 1 << 6)


@dataclass(frozen=True)
class Auth:
    """HTTP authentication of an attempt: `basic` (username, secret = password) or `bearer` (secret = token)."""

    kind: str
    secret: str
    username: str = ""

    def __repr__(self) -> str:  # never the secret, wherever an Auth is printed
        return f"Auth(kind={self.kind!r}, username={self.username!r})"


@dataclass(frozen=True)
class ClientCert:
    """A client certificate (PEM, with its chain) and its private key (PEM) for mutual TLS."""

    certificate: bytes
    private_key: bytes

    def __repr__(self) -> str:
        return "ClientCert(...)"


@dataclass(frozen=True)
class Route:
    """How an attempt reaches its host through WEBHOOK_PROXY_URL: the proxy, and CONNECT_TO entries
    (`host:port:address:port`) naming the address Herald checked."""

    proxy: str
    connect_to: tuple[str, ...]


def route_for(url: str, *, proxy: str, timeout: float, allow_private_networks: bool) -> Route:
    """The route of a request to `url` through `proxy`: the URL's host resolved here (within `timeout`),
    each address checked as at connect time, and the proxy told to connect to the first allowed one.
    Raise ValueError (`blocked_address: …` or `dns_error: …`) when there is none."""
    parts = urlsplit(ascii_url(url))
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = _resolve(host, port, timeout)
    except ValueError as exc:
        raise ValueError(f"connection_error: {exc}") from None
    allowed = [ip for ip in addresses if allow_private_networks or is_public_address(ip)]
    if not allowed:
        raise ValueError(f"blocked_address: {addresses[0] if addresses else host} is not a public address")
    ip = allowed[0]
    target = f"[{ip}]" if ":" in ip else ip
    url_host = f"[{host}]" if ":" in host else host
    return Route(proxy=proxy, connect_to=(f"{url_host}:{port}:{target}:{port}",))


class Attempt:
    """One POST set up on a libcurl handle: `send()` runs it at once, a CurlMulti can drive many together.

    ``timeout`` bounds the whole attempt: name resolution, connecting, TLS, sending and reading.
    Redirects are not followed (a 3xx is a failure). Unless ``allow_private_networks``, every
    address the host resolves to is checked when the socket is opened and a non-public one is
    refused (so DNS rebinding cannot reach internal services). At most 4 KiB of the answer is read.
    """

    def __init__(self, curl: pycurl.Curl, *, url: str, body: bytes, headers: Mapping[str, str], timeout: float,
                 allow_private_networks: bool, auth: Auth | None = None, client_cert: ClientCert | None = None,
                 route: Route | None = None, ca_file: str | None = None,
                 body_limit: int = EXCERPT_LIMIT, header_lines: Sequence[str] = ()) -> None:
        self.curl = curl
        self.body_limit = body_limit
        self.timeout = timeout
        self.allow_private_networks = allow_private_networks
        self.excerpt = bytearray()
        self.retry_after: list[str] = []
        self.blocked: list[str] = []
        self.proxied = route is not None and bool(route.proxy)
        millis = max(1, int(timeout * 1000))
        curl.setopt(pycurl.URL, ascii_url(url))
        curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.POST, 1)
        curl.setopt(pycurl.POSTFIELDS, body)
        # No `Expect: 100-continue` round trip; no Accept-Encoding, so the excerpt is the raw body.
        # `header_lines` are more headers, already `Name: value` (an endpoint's own, built once per process).
        lines = [f"{name}: {value}" for name, value in headers.items()]
        lines += header_lines
        lines.append("Expect:")
        curl.setopt(pycurl.HTTPHEADER, lines)
        curl.setopt(pycurl.NOSIGNAL, 1)  # required with threads; the resolver is threaded, so DNS is bounded too
        curl.setopt(pycurl.TIMEOUT_MS, millis)
        curl.setopt(pycurl.CONNECTTIMEOUT_MS, millis)
        curl.setopt(pycurl.FOLLOWLOCATION, 0)
        if self.proxied:
            # The proxy is told to connect to the address checked by `route_for` (CONNECT_TO: a CONNECT
            # to that address, or a SOCKS5 request for it), through a tunnel even for http:// URLs; TLS is
            # still verified against the URL's host name. The only socket libcurl opens is the proxy's.
            curl.setopt(pycurl.PROXY, route.proxy)
            curl.setopt(pycurl.NOPROXY, "")
            curl.setopt(pycurl.HTTPPROXYTUNNEL, 1)
            curl.setopt(pycurl.CONNECT_TO, list(route.connect_to))
        else:
            curl.setopt(pycurl.PROXY, "")  # never a proxy from the environment
            curl.setopt(pycurl.NOPROXY, "*")
        curl.setopt(pycurl.CAINFO, ca_file or certifi.where())
        if auth is not None:
            if auth.kind == "basic":
                curl.setopt(pycurl.HTTPAUTH, pycurl.HTTPAUTH_BASIC)
                curl.setopt(pycurl.USERNAME, auth.username)
                curl.setopt(pycurl.PASSWORD, auth.secret)
            else:  # a bearer token (RFC 6750), given or from an OAuth2 token endpoint
                curl.setopt(pycurl.HTTPAUTH, _HTTPAUTH_BEARER)
                curl.setopt(pycurl.XOAUTH2_BEARER, auth.secret)
        if client_cert is not None:
            # Mutual TLS from memory: the private key is never written to disk.
            curl.setopt(pycurl.SSLCERTTYPE, "PEM")
            curl.setopt(pycurl.SSLCERT_BLOB, client_cert.certificate)
            curl.setopt(pycurl.SSLKEYTYPE, "PEM")
            curl.setopt(pycurl.SSLKEY_BLOB, client_cert.private_key)
        curl.setopt(pycurl.OPENSOCKETFUNCTION, self._open_socket)
        curl.setopt(pycurl.WRITEFUNCTION, self._body)
        curl.setopt(pycurl.HEADERFUNCTION, self._header)
        self.started = time.monotonic()

    def _body(self, chunk: bytes) -> int | None:
        room = self.body_limit + 1 - len(self.excerpt)
        self.excerpt.extend(chunk[:room])
        # One byte past the limit: the rest is not wanted. Stopping closes the connection (it cannot
        # be reused mid-body), which is cheaper than reading megabytes to keep it alive.
        return 0 if len(self.excerpt) > self.body_limit else None

    def _header(self, line: bytes) -> None:
        if line[:5] == b"HTTP/":
            self.retry_after.clear()  # a new response (after a 1xx): only its own headers count
            return
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"retry-after":
            self.retry_after.append(value.strip().decode("latin-1"))

    def _open_socket(self, purpose: int, address: tuple) -> socket.socket | int:
        family, socktype, protocol, sockaddr = address
        # Through a proxy, the socket is the proxy's (the operator's choice, often on a private network);
        # the endpoint's address was checked before (`route_for`).
        if not self.proxied and not self.allow_private_networks and not is_public_address(sockaddr[0]):
            self.blocked.append(sockaddr[0])
            return pycurl.SOCKET_BAD
        return socket.socket(family, socktype, protocol)

    def finish(self, code: int = 0, message: str = "") -> AttemptResult:
        """The result, once libcurl is done with the transfer (`code`, `message`: its error, if any)."""
        duration_ms = int((time.monotonic() - self.started) * 1000)
        curl = self.curl
        error = ""
        if code and not (code == pycurl.E_WRITE_ERROR and len(self.excerpt) > self.body_limit):  # our own stop is fine
            error = _describe_failure(code, message, curl.getinfo(pycurl.OS_ERRNO), self.timeout, self.blocked)
        status = None if self.blocked else (curl.getinfo(pycurl.RESPONSE_CODE) or None)
        if not error and status is not None and 300 <= status < 400:
            error = "redirect_not_followed"
        return AttemptResult(
            status=status,
            # PostgreSQL text cannot hold NUL: a receiver that answers one gets U+FFFD in its excerpt
            body=bytes(self.excerpt[:self.body_limit]).decode("utf-8", errors="replace").replace("\x00", "\ufffd"),
            duration_ms=duration_ms,
            error=error,
            retry_after=self.retry_after[-1] if self.retry_after else None,
        )


def send(
    *,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    allow_private_networks: bool,
    auth: Auth | None = None,
    client_cert: ClientCert | None = None,
    proxy: str = "",
    ca_file: str | None = None,
    body_limit: int = EXCERPT_LIMIT,
) -> AttemptResult:
    """POST ``body`` to ``url`` once on this thread's handle (see `Attempt`), through ``proxy`` if one is
    given (see `route_for`); a failure is reported in the result, never raised."""
    started = time.monotonic()
    route = None
    if proxy:
        try:
            route = route_for(url, proxy=proxy, timeout=timeout, allow_private_networks=allow_private_networks)
        except ValueError as exc:
            return AttemptResult(status=None, body="", duration_ms=int((time.monotonic() - started) * 1000),
                                 error=str(exc)[:_MAX_ERROR_CHARS], retry_after=None)
        timeout = max(0.001, timeout - (time.monotonic() - started))
    attempt = Attempt(_handle(), url=url, body=body, headers=headers, timeout=timeout,
                      allow_private_networks=allow_private_networks, auth=auth, client_cert=client_cert,
                      route=route, ca_file=ca_file, body_limit=body_limit)
    try:
        attempt.curl.perform()
    except pycurl.error as exc:
        return attempt.finish(exc.args[0], str(exc.args[1]))
    return attempt.finish()
