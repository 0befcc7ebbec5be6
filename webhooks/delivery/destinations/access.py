"""Endpoint access (SPEC §11): extra headers, `Authorization` and a client certificate for an endpoint's
attempts, and the way through WEBHOOK_PROXY_URL.

- Validation of what a tenant sends (`headers_validate`, `auth_validate`, `client_certificate_validate`):
  pure functions, raising `AccessRefused` (a 400 naming the field). The endpoint service stores the result
  (services/endpoints.py), every secret encrypted with the signing secrets' keys.
- The worker's side: the claim reads each endpoint's access with its deliveries (`ACCESS_COLUMNS`);
  `prepare` turns one into what libcurl needs for one attempt: the headers, basic or bearer auth (an
  OAuth2 client-credentials token, fetched and cached here), the client certificate and, with a proxy,
  the address Herald checked. A token fetch or a proxied attempt's DNS lookup blocks, so the engine
  prepares those on a thread of its own (`needs_thread`).

OAuth2 (RFC 6749 §4.4): oauthlib's BackendApplicationClient builds the form body and parses the
answer; the client authenticates with HTTP Basic (§2.3.1, the method every server must support); the
request is a libcurl POST with the attempts' SSRF check, proxy and deadline. A token is reused by
every attempt of this process until shortly before its `expires_in`, and dropped when the endpoint
answers 401 (the next attempt fetches a new one) or when no live endpoint uses it any more (see
`caches_forget`: what a deleted endpoint or tenant left is dropped at the next claim). Secrets never
reach a log line or an error.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote_plus

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from oauthlib.oauth2 import BackendApplicationClient
from oauthlib.oauth2.rfc6749.errors import OAuth2Error

from webhooks import crypto, tracing
from webhooks.delivery import signing
from webhooks.delivery.destinations import http_transport as transport
from webhooks import crypto, tracing
from webhooks.conf import herald_settings
from webhooks.delivery import signing
from webhooks.delivery.destinations import brokers
from webhooks.delivery.destinations import http_transport as transport
from webhooks.delivery.destinations.base import AttemptResult
from webhooks.models import EndpointAccess

logger = logging.getLogger("herald.access")

MAX_HEADERS = 20
MAX_HEADER_NAME = 64
MAX_HEADER_VALUE = 1024
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
# Herald sets these itself (or they belong to the connection, not the request): never a tenant's.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "user-agent", "authorization",
                              "connection", "transfer-encoding", "expect", "keep-alive", "te", "trailer",
                              "upgrade", "proxy-authorization", "proxy-connection"})
MAX_SECRET = 4096
MAX_PEM = 65536
# A token is dropped this long before it expires (at most; a tenth of a short lifetime).
TOKEN_MARGIN_SECONDS = 30.0
# A token answered without expires_in is reused for at most this long (or until a 401).
TOKEN_DEFAULT_SECONDS = 3600.0
TOKEN_BODY_LIMIT = 65536


class AccessRefused(ValueError):
    """What the tenant sent for `field` cannot be used: the message says why (a 400 naming the field)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


# -- validation (the API's input) -----------------------------------------------------------


def headers_validate(headers: dict | None) -> dict[str, str]:
    """The endpoint's extra headers, checked: at most 20, names `[A-Za-z0-9-]` (≤ 64), values printable
    ASCII (≤ 1 KiB), none Herald sets itself, no name twice (in any case)."""
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise AccessRefused("headers", "Must be an object of header names to values.")
    if len(headers) > MAX_HEADERS:
        raise AccessRefused("headers", f"At most {MAX_HEADERS} headers.")
    seen: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise AccessRefused("headers", f"Header names are 1-{MAX_HEADER_NAME} characters of [A-Za-z0-9-]: "
                                           f"{str(name)[:80]!r}.")
        lower = name.lower()
        if lower in RESERVED_HEADERS or lower.startswith("webhook-"):
            raise AccessRefused("headers", f"Header {name!r} is set by Herald itself and cannot be overridden.")
        if lower in seen:
            raise AccessRefused("headers", f"Header {name!r} is given twice.")
        seen.add(lower)
        if not isinstance(value, str) or len(value) > MAX_HEADER_VALUE or not _PRINTABLE.fullmatch(value):
            raise AccessRefused("headers", f"The value of {name!r} must be printable ASCII of at most "
                                           f"{MAX_HEADER_VALUE} characters.")
    return dict(headers)


def _text(auth: dict, key: str, *, required: bool, limit: int = 1024, printable: bool = False) -> str:
    value = auth.get(key)
    if value is None or value == "":
        if required:
            raise AccessRefused("auth", f"{key!r} is required for auth type {auth.get('type')!r}.")
        return ""
    if not isinstance(value, str) or len(value) > limit or any(ord(c) < 0x20 or ord(c) == 0x7f for c in value):
        raise AccessRefused("auth", f"{key!r} must be a string of at most {limit} characters, without control "
                                    "characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON's \ud800)
        raise AccessRefused("auth", f"{key!r} must be valid Unicode text.") from None
    if printable and not _PRINTABLE.fullmatch(value):
        raise AccessRefused("auth", f"{key!r} must be printable ASCII.")
    return value


AUTH_FIELDS = {
    "basic": {"username", "password"},
    "bearer": {"token"},
    "oauth2_client_credentials": {"token_url", "client_id", "client_secret", "scope", "audience"},
}


@dataclass(frozen=True)
class AuthInput:
    """Validated auth: its type, what may be shown, and its one secret."""

    type: str
    shown: dict
    secret: str = field(repr=False)


def auth_validate(auth: dict | None) -> AuthInput | None:
    """The endpoint's auth, checked (the token URL's host is checked by the caller, as an endpoint URL)."""
    if auth is None:
        return None
    if not isinstance(auth, dict):
        raise AccessRefused("auth", "Must be null or an object with a `type`.")
    kind = auth.get("type")
    if kind not in AUTH_FIELDS:
        raise AccessRefused("auth", f"`type` must be one of {sorted(AUTH_FIELDS)}.")
    unknown = set(auth) - AUTH_FIELDS[kind] - {"type"}
    if unknown:
        raise AccessRefused("auth", f"Unknown fields for auth type {kind!r}: {sorted(unknown)}.")
    if kind == "basic":
        username = _text(auth, "username", required=True, limit=256)
        if ":" in username:
            raise AccessRefused("auth", "A Basic user name cannot contain ':' (RFC 7617).")
        return AuthInput(kind, {"username": username}, _text(auth, "password", required=True, limit=1024))
    if kind == "bearer":
        token = _text(auth, "token", required=True, limit=MAX_SECRET, printable=True)
        if " " in token:
            raise AccessRefused("auth", "'token' cannot contain spaces.")
        return AuthInput(kind, {}, token)
    token_url = _text(auth, "token_url", required=True, limit=2000)
    if not token_url.lower().startswith(("http://", "https://")):
        raise AccessRefused("auth", "'token_url' must be an http or https URL.")
    shown = {"token_url": token_url, "client_id": _text(auth, "client_id", required=True, limit=512),
             "scope": _text(auth, "scope", required=False, limit=1024, printable=True) or None,
             "audience": _text(auth, "audience", required=False, limit=1024) or None}
    return AuthInput(kind, shown, _text(auth, "client_secret", required=True, limit=MAX_SECRET))


@dataclass(frozen=True)
class CertificateInput:
    certificate: str
    private_key: str = field(repr=False)
    subject: str
    expires_at: datetime


def client_certificate_validate(value: dict | None) -> CertificateInput | None:
    """A client certificate (PEM; its chain may follow) and its unencrypted private key (PEM), parsed with
    `cryptography`: both must load, belong together, and the certificate must not have expired."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"certificate", "private_key"}:
        raise AccessRefused("client_certificate", "Must be null or {certificate, private_key}, both PEM.")
    cert_pem, key_pem = value["certificate"], value["private_key"]
    if not all(isinstance(pem, str) and 0 < len(pem) <= MAX_PEM and pem.isascii() for pem in (cert_pem, key_pem)):
        raise AccessRefused("client_certificate", f"certificate and private_key must be PEM text of at most "
                                                  f"{MAX_PEM} characters.")
    try:
        certificate = x509.load_pem_x509_certificates(cert_pem.encode("ascii"))[0]
    except ValueError:
        raise AccessRefused("client_certificate", "certificate is not a PEM X.509 certificate.") from None
    try:
        key = serialization.load_pem_private_key(key_pem.encode("ascii"), password=None)
    except TypeError:
        raise AccessRefused("client_certificate", "private_key is encrypted: give it without a passphrase "
                                                  "(Herald stores it encrypted).") from None
    except (ValueError, Exception):  # noqa: BLE001 - unsupported algorithms raise UnsupportedAlgorithm
        raise AccessRefused("client_certificate", "private_key is not a PEM private key.") from None
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise AccessRefused("client_certificate", "private_key does not belong to the certificate.")
    expires_at = certificate.not_valid_after_utc
    if expires_at <= datetime.now(UTC):
        raise AccessRefused("client_certificate", f"The certificate expired at {expires_at.isoformat()}.")
    return CertificateInput(cert_pem, key_pem, certificate.subject.rfc4514_string(), expires_at)


# -- the worker's side ----------------------------------------------------------------------


@dataclass(frozen=True)
class OAuth2:
    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None = None
    audience: str | None = None

    @property
    def key(self) -> str:
        """Identifies the token's source: a change of any field means another token."""
        parts = [self.token_url, self.client_id, self.client_secret, self.scope or "", self.audience or ""]
        return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Access:
    """An endpoint's access as an attempt uses it (secrets decrypted; `repr` shows none).

    Loaded once per process and access row (`access_from_rows`), so what every attempt would otherwise
    redo is done here: the headers as libcurl takes them (`Name: value` lines, appended to Herald's own),
    and the same without a `traceparent` or `tracestate` of the tenant's, for a process that traces (its
    attempt's own traceparent goes to the receiver, never two).
    """

    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    auth: transport.Auth | None = None
    oauth2: OAuth2 | None = None
    client_cert: transport.ClientCert | None = None
    target: brokers.Target | None = None  # a broker endpoint's (SPEC §14): its kind, URL with credentials, fields
    header_lines: tuple[str, ...] = field(init=False, repr=False)
    header_lines_traced: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lines = tuple(f"{name}: {value}" for name, value in self.headers)
        traced = tuple(line for line, (name, _) in zip(lines, self.headers)
                       if name.lower() not in _TRACE_HEADERS)
        object.__setattr__(self, "header_lines", lines)
        object.__setattr__(self, "header_lines_traced", traced if len(traced) < len(lines) else lines)


_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


ACCESS_TABLE = EndpointAccess._meta.db_table
# What the claim (delivery/leases.py) reads of an endpoint's access, beside each claimed delivery: a flag
# (the endpoint has access), then what `access_from_rows` takes after the endpoint id.
ACCESS_COLUMNS = ("a.endpoint_id IS NOT NULL, a.updated_at, a.encrypted_headers, a.auth_type, a.auth_shown, "
                  "a.encrypted_auth_secret, a.certificate, a.encrypted_private_key, a.destination, a.encrypted_url")
_loaded: dict[tuple[str, datetime], Access] = {}
_loaded_lock = threading.Lock()

# What this process holds of endpoints' secrets (decrypted access in `_loaded`, OAuth2 `tokens`, and the
# signing secrets and access that crypto's cache of decryptions keeps) must not outlive the endpoint, its
# access as it was, or its tenant. The claim asks (delivery/leases.py: `caches_check_due`, then
# `caches_forget` with what is live) every CACHE_CHECK_SECONDS, and at once when a claimed endpoint's access
# is not loaded yet: a new endpoint or a change is when a deleted one's token could otherwise be reused.
CACHE_CHECK_SECONDS = 5.0
_claimed: set[str] = set()  # endpoints whose signing secrets this process has decrypted since the last check
_checked_at = 0.0


def caches_check_due(endpoint_ids: list[str], access_keys: list[tuple[str, datetime]]) -> list[str] | None:
    """At a claim of `endpoint_ids` (with access rows `access_keys`): None if the caches need no check now,
    else the endpoints to ask about (are they live, and which version of their access)."""
    global _checked_at
    with _loaded_lock:
        _claimed.update(endpoint_ids)
        if len(_claimed) > 10000:  # never grows without bound: forgotten with crypto's cache (`_loaded`, whose
            _claimed.clear()       # endpoints are asked about too, and its tokens stay)
            crypto.forget()
        now = time.monotonic()
        missing = any(key not in _loaded for key in access_keys)
        if not (missing or now - _checked_at >= CACHE_CHECK_SECONDS):
            return None
        _checked_at = now
        return list(_claimed | {endpoint_id for endpoint_id, _ in _loaded})


def caches_forget(live: dict[str, datetime | None]) -> int:
    """Drop what deleted endpoints (and tenants) and older versions of an access left in this process:
    `live` maps each endpoint asked about that is live to its access's version (None: it has none). The
    number of endpoints or access versions dropped."""
    with _loaded_lock:
        stale = [key for key in _loaded if live.get(key[0], "gone") != key[1]]
        for key in stale:
            del _loaded[key]
        gone = {endpoint_id for endpoint_id in _claimed if endpoint_id not in live}
        _claimed.difference_update(gone)
        tokens.keep_only({access.oauth2.key for access in _loaded.values() if access.oauth2 is not None})
        if stale or gone:
            crypto.forget()
            signing.forget()
    return len(stale) + len(gone)


def access_from_rows(rows: list[tuple]) -> tuple[dict[str, Access], set[str]]:
    """The access of the endpoints in `rows` ((endpoint id, then ACCESS_COLUMNS after the flag), from a claimed
    batch), and the endpoints whose secrets no configured key opens."""
    found: dict[str, Access] = {}
    broken: set[str] = set()
    for endpoint_id, updated_at, *columns in rows:
        cached = _loaded.get((endpoint_id, updated_at))
        if cached is not None:
            found[endpoint_id] = cached
            continue
        try:
            access = _access_from_row((endpoint_id, updated_at), *columns)
        except crypto.InvalidToken:
            broken.add(endpoint_id)
            continue
        with _loaded_lock:
            if len(_loaded) > 10000:
                _loaded.clear()
            _loaded[(endpoint_id, updated_at)] = access
        found[endpoint_id] = access
    return found, broken


def _access_from_row(key, enc_headers, auth_type, shown, enc_secret, certificate, enc_key, destination,
                     enc_url) -> Access:
    if isinstance(shown, str):
        shown = json.loads(shown)
    if isinstance(destination, str):
        destination = json.loads(destination)
    target = None
    if destination:
        options = {name: value for name, value in destination.items() if name != "kind"}
        target = brokers.Target(destination["kind"], crypto.decrypt(enc_url), options, key)
    headers = tuple(json.loads(crypto.decrypt(enc_headers)).items()) if enc_headers else ()
    secret = crypto.decrypt(enc_secret) if enc_secret else ""
    auth = oauth2 = None
    if auth_type == "basic":
        auth = transport.Auth("basic", secret, shown.get("username", ""))
    elif auth_type == "bearer":
        auth = transport.Auth("bearer", secret)
    elif auth_type == "oauth2_client_credentials":
        oauth2 = OAuth2(shown["token_url"], shown["client_id"], secret, shown.get("scope"), shown.get("audience"))
    client_cert = None
    if certificate:
        client_cert = transport.ClientCert(certificate.encode("ascii"), crypto.decrypt(enc_key).encode("ascii"))
    return Access(headers, auth, oauth2, client_cert, target)


@dataclass(frozen=True)
class Prepared:
    """What one attempt sends with (or `error`: why it failed before sending)."""

    headers: dict[str, str] = field(repr=False)
    timeout: float
    auth: transport.Auth | None = None
    client_cert: transport.ClientCert | None = None
    route: transport.Route | None = None
    oauth2_token: str | None = field(default=None, repr=False)  # to drop after a 401
    error: str = ""
    spent_ms: int = 0  # what preparing took (the duration of an attempt that failed here)
    header_lines: tuple[str, ...] = field(default=(), repr=False)  # the endpoint's headers (Access.header_lines)


class TokenError(Exception):
    """The token endpoint gave no token; the message (no secret in it) becomes the attempt's error."""


class TokenCache:
    """OAuth2 tokens of this process, by their source (OAuth2.key), until shortly before they expire.

    One fetch per source at a time: attempts that need the same token while it is fetched wait for it.
    """

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, float]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def cached(self, oauth2: OAuth2) -> str | None:
        entry = self._tokens.get(oauth2.key)
        if entry is not None and time.monotonic() < entry[1]:
            return entry[0]
        return None

    def get(self, oauth2: OAuth2, *, timeout: float) -> str:
        token = self.cached(oauth2)
        if token is not None:
            return token
        with self._lock:
            lock = self._locks.setdefault(oauth2.key, threading.Lock())
        if not lock.acquire(timeout=timeout):
            raise TokenError(f"oauth2_token: no token within the deadline of {timeout:g}s")
        try:
            token = self.cached(oauth2)  # fetched by another attempt while this one waited
            if token is None:
                token, lifetime = token_fetch(oauth2, timeout=timeout)
                margin = min(TOKEN_MARGIN_SECONDS, lifetime / 10)
                self._tokens[oauth2.key] = (token, time.monotonic() + lifetime - margin)
            return token
        finally:
            lock.release()

    def drop(self, oauth2: OAuth2, token: str) -> None:
        """The endpoint refused `token` (401): the next attempt fetches a new one."""
        with self._lock:
            if self._tokens.get(oauth2.key, ("",))[0] == token:
                del self._tokens[oauth2.key]

    def clear(self) -> None:
        with self._lock:
            self._tokens.clear()

    def keep_only(self, keys: set[str]) -> None:
        """Drop every token but those of these sources (the live endpoints' whose access is loaded)."""
        with self._lock:
            for key in [key for key in self._tokens if key not in keys]:
                del self._tokens[key]
            for key in [key for key in self._locks if key not in keys and not self._locks[key].locked()]:
                del self._locks[key]


tokens = TokenCache()


def token_fetch(oauth2: OAuth2, *, timeout: float) -> tuple[str, float]:
    """A token from the token endpoint (client credentials grant) and its lifetime in seconds; TokenError."""
    client = BackendApplicationClient(client_id=oauth2.client_id)
    extra = {"audience": oauth2.audience} if oauth2.audience else {}
    body = client.prepare_request_body(scope=oauth2.scope or None, **extra)
    # RFC 6749 §2.3.1: the client id and secret, form-encoded, as HTTP Basic credentials.
    credentials = transport.Auth("basic", quote_plus(oauth2.client_secret), quote_plus(oauth2.client_id))
    delivery = herald_settings.delivery  # the token is fetched as an attempt is sent: same policy, proxy, CAs
    result = transport.send(
        url=oauth2.token_url, body=body.encode("utf-8"), timeout=timeout, auth=credentials,
        headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json",
                 "User-Agent": f"Herald/{delivery.version}"},
        allow_private_networks=delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS, proxy=delivery.WEBHOOK_PROXY_URL,
        ca_file=delivery.WEBHOOK_CA_BUNDLE or None, body_limit=TOKEN_BODY_LIMIT)
    if result.error:
        raise TokenError(f"oauth2_token: {result.error}")
    try:
        try:
            token = client.parse_request_body_response(result.body, scope=oauth2.scope or None)
        except Warning as changed:  # the server granted another scope than asked for: its call
            token = changed.token
    except OAuth2Error as exc:
        raise TokenError(f"oauth2_token: the token endpoint answered {result.status} {exc.error}"
                         + (f" ({exc.description})" if exc.description else "")) from None
    except ValueError:
        raise TokenError(f"oauth2_token: the token endpoint answered {result.status} without a token") from None
    if result.status != 200:
        raise TokenError(f"oauth2_token: the token endpoint answered {result.status}")
    if str(token.get("token_type", "bearer")).lower() != "bearer":
        raise TokenError(f"oauth2_token: token type {str(token.get('token_type'))[:40]!r} is not bearer")
    access_token = token["access_token"]
    if not isinstance(access_token, str) or not access_token or not _PRINTABLE.fullmatch(access_token):
        raise TokenError("oauth2_token: the access token is not printable ASCII")
    expires_in = token.get("expires_in")
    lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else TOKEN_DEFAULT_SECONDS
    return access_token, lifetime


def needs_thread(access: Access | None) -> bool:
    """True when preparing this attempt blocks: a token to fetch, or a host to resolve for the proxy."""
    if herald_settings.delivery.WEBHOOK_PROXY_URL:
        return True
    return access is not None and access.oauth2 is not None and tokens.cached(access.oauth2) is None


def prepare(*, url: str, headers: dict[str, str], access: Access | None, timeout: float) -> Prepared:
    """Everything the attempt to `url` needs besides its body, within `timeout` (what it leaves is the
    attempt's own deadline). A token or proxy failure is returned as `error`, never raised."""
    started = time.monotonic()
    auth = client_cert = token = route = None
    lines: tuple[str, ...] = ()
    if access is not None:
        # Herald's own headers stay a dict (tracing adds the traceparent to it); the endpoint's are lines,
        # built when its access was loaded: none of Herald's names can be among them (headers_validate).
        lines = access.header_lines_traced if tracing.ENABLED else access.header_lines
        auth, client_cert = access.auth, access.client_cert
        if access.oauth2 is not None:
            try:
                token = tokens.get(access.oauth2, timeout=timeout)
            except TokenError as exc:
                return Prepared(headers, 0, error=str(exc)[:200], spent_ms=_ms_since(started))
            auth = transport.Auth("bearer", token)
    delivery = herald_settings.delivery
    if delivery.WEBHOOK_PROXY_URL:
        try:
            route = transport.route_for(url, proxy=delivery.WEBHOOK_PROXY_URL,
                                        timeout=max(0.001, timeout - (time.monotonic() - started)),
                                        allow_private_networks=delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS)
        except ValueError as exc:
            return Prepared(headers, 0, error=str(exc)[:200], spent_ms=_ms_since(started))
    remaining = max(0.001, timeout - (time.monotonic() - started))
    return Prepared(headers, remaining, auth, client_cert, route, token, header_lines=lines)


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def after_attempt(access: Access | None, prepared: Prepared, result: AttemptResult) -> None:
    """A 401 to an OAuth2 token: drop it, so that the next attempt fetches a new one."""
    if result.status == 401 and prepared.oauth2_token and access is not None and access.oauth2 is not None:
        tokens.drop(access.oauth2, prepared.oauth2_token)
