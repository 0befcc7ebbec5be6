"""Endpoint services: create, update, disable, delete (cancelling pending deliveries), rotate the secret."""
import json
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from webhooks import crypto, filters
from webhooks.conf import herald_settings
from webhooks.delivery import addresses, deliveries, endpoints, outbox
from webhooks.delivery.destinations import access, brokers
from webhooks.delivery.destinations.kinds import BROKERS
from webhooks.delivery.endpoints import deliveries_fail_waiting, endpoint_disable  # noqa: F401 - the service's name for it
from webhooks.delivery.parked import endpoint_hand_on
from webhooks.delivery.signing import generate_signing_key
from webhooks.models import Endpoint, EndpointAccess, EndpointSecret, Tenant

# How long a rotated-out secret keeps signing, so receivers can roll over (Svix does the same).
OLD_SECRET_GRACE = timedelta(hours=24)

# The breaker and failure clock of an endpoint that starts afresh (re-enabled, or pointed elsewhere).
_FRESH_START = {"failing_since": None, "consecutive_failures": 0, "tripped_at": None, "next_probe_at": None,
                "failed_probes": 0}



class EndpointUrlRefused(ValueError):
    """The URL is not http(s), carries credentials, or its host resolves (in time) to no address Herald may
    call."""


def endpoint_url_check(*, url: str) -> None:
    """Refuse URLs that are not http(s), that carry a user name or password, or (unless allowed) that point
    into private networks or whose DNS lookup takes longer than ENDPOINT_DNS_TIMEOUT_SECONDS."""
    try:
        _HTTP_URL(url)
    except ValidationError:
        raise EndpointUrlRefused("Enter a valid URL.") from None
    try:
        userinfo = "@" in urlsplit(url).netloc
    except ValueError:
        userinfo = False  # not a URL at all: said below
    if userinfo:
        # A URL is shown wherever its endpoint is, and travels in Herald's own events (herald.endpoint.*)
        # to the tenant's other receivers: credentials have no place in it.
        raise EndpointUrlRefused("The URL must not contain a user name or password.")
    if herald_settings.delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS:
        if not url.lower().startswith(("http://", "https://")):
            raise EndpointUrlRefused("The URL must use http or https.")
        return
    try:
        addresses.check_url_host(url, dns_timeout=herald_settings.delivery.ENDPOINT_DNS_TIMEOUT_SECONDS)
    except ValueError as exc:
        raise EndpointUrlRefused(str(exc)) from None


_HTTP_URL = URLValidator(schemes=["http", "https"])


def endpoint_filter_check(value) -> str | None:
    """What creating or updating an endpoint runs on its filter: its jsonpath, or FilterInvalid (for a form
    that must refuse what the API refuses, the admin's)."""
    return _filter_path(value)


def _filter_path(value) -> str | None:
    """The filter's jsonpath (filters.filter_compile), which PostgreSQL has parsed: should the compiler ever
    emit one it refuses, that is a FilterInvalid here rather than an error writing the row."""
    path = filters.filter_compile(value)
    if path is not None and path not in _PARSED:
        try:
            with transaction.atomic(), connection.cursor() as cursor:  # (a savepoint: the caller's transaction goes on)
                cursor.execute("SELECT %s::jsonpath", [path])
        except DatabaseError:
            raise filters.FilterInvalid("", "This filter cannot be used.") from None
        if len(_PARSED) < 4096:
            _PARSED.add(path)
    return path


_PARSED: set[str] = set()


class EndpointQuotaExceeded(ValueError):
    """The tenant has as many endpoints as it may (its `max_endpoints`, or TENANT_MAX_ENDPOINTS)."""


class TenantGone(LookupError):
    """The tenant was deleted while the call was under way."""


def tenant_max_endpoints(tenant: Tenant) -> int:
    """The endpoints a tenant may have: its own limit, or the deployment's default."""
    return herald_settings.api.TENANT_MAX_ENDPOINTS if tenant.max_endpoints is None else tenant.max_endpoints


def endpoint_max_in_flight(endpoint: Endpoint) -> int:
    """The endpoint's cap on attempts in flight: its own, or the deployment's default."""
    return endpoint.max_in_flight or herald_settings.delivery.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT


@transaction.atomic
def endpoint_create(*, tenant: Tenant, url: str = "", event_types: list[str], channels: list[str],
                    description: str = "", max_in_flight: int | None = None, throttle_rate: int | None = None,
                    ordering: str = Endpoint.UNORDERED, kind: str = Endpoint.HTTP, signature: str = Endpoint.V1,
                    filter: dict | None = None, **access_given) -> Endpoint:  # noqa: A002 - the API's name
    """Create an endpoint with a fresh `whsec_` secret, or with `signature` v1a a `whsk_` ed25519 key (read
    it with `endpoint_secret`), and its payload filter (FilterInvalid if it cannot be used), within the
    tenant's `max_endpoints`, and its access (`headers`, `auth`, `client_certificate`: see
    `endpoint_access_fields`) if given. A poll endpoint has no URL: Herald never connects anywhere for it
    (nor takes access for it). A broker endpoint (SPEC §14: `kind` amqp, redis_stream or nats) takes its URL
    and its kind's fields (`endpoint_destination_fields`), and no HTTP access.

    The count is taken under the tenant's row lock (FOR NO KEY UPDATE: intake's inserts, which take
    FOR KEY SHARE on it for their foreign key, do not wait for it), so two creates at the limit
    cannot both pass; a deletion of the tenant waits for it too, and then takes the new endpoint down
    with the others.
    """
    destination_given = {name: access_given.pop(name) for name in DESTINATION_FIELDS if name in access_given}
    if kind == Endpoint.POLL:
        if url:
            raise EndpointUrlRefused("A poll endpoint has no URL: its consumer reads its messages.")
    elif kind not in BROKERS:
        endpoint_url_check(url=url)  # (a DNS lookup: before the lock)
    access_fields = endpoint_access_fields(kind=kind, **access_given)  # every check first
    shown_url, destination = endpoint_destination_fields(kind=kind, url=url or None, given=destination_given,
                                                         current=None)
    if shown_url is not None:
        url = shown_url
    filter_path = _filter_path(filter)
    locked = Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk, deleted_at__isnull=True).first()
    if locked is None:
        raise TenantGone(tenant.pk)
    limit = tenant_max_endpoints(locked)
    if Endpoint.objects.filter(tenant=locked, deleted_at__isnull=True).count() >= limit:
        raise EndpointQuotaExceeded(
            f"This tenant already has its {limit} endpoints (max_endpoints); delete one, or ask for a higher limit.")
    endpoint = endpoints.endpoint_insert(tenant=tenant, kind=kind, url=url, event_types=event_types,
                                         channels=channels, description=description, max_in_flight=max_in_flight,
                                         throttle_rate=throttle_rate, ordering=ordering, signature=signature,
                                         filter=filter, filter_path=filter_path)
    _issue_secret(endpoint=endpoint)
    _access_save(endpoint=endpoint, fields={**access_fields, **destination})
    return endpoint


ACCESS_FIELDS = ("headers", "auth", "client_certificate")
# The broker kinds' own fields (SPEC §14), each kind's named by its module (webhooks/delivery/destinations/).
DESTINATION_FIELDS = tuple(sorted({name for module in BROKERS.values() for name in module.fields}))
UPDATABLE_FIELDS = ("url", "event_types", "channels", "description", "enabled", "max_in_flight", "throttle_rate",
                    "ordering", "signature", "filter") + ACCESS_FIELDS + DESTINATION_FIELDS


class EndpointAccessRefused(ValueError):
    """Headers, auth, a client certificate or a broker's field that cannot be used (`field` names which)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def endpoint_access_fields(*, kind: str = Endpoint.HTTP, **given) -> dict:
    """The EndpointAccess columns for what is given of `headers`, `auth` and `client_certificate` (each
    replaces the endpoint's whole current value; null or {} removes it), checked and with every secret
    encrypted. EndpointAccessRefused when one cannot be used; nothing is written here. An endpoint of another
    kind than http (poll, a broker) is never POSTed to: any of them given non-empty is refused."""
    unknown = set(given) - set(ACCESS_FIELDS)
    if unknown:
        raise TypeError(f"unknown access fields {sorted(unknown)}")
    if kind != Endpoint.HTTP:
        for name in ACCESS_FIELDS:
            if given.get(name):
                raise EndpointAccessRefused(name, f"A {kind} endpoint is never POSTed to: it takes no headers, auth "
                                                  "or client certificate.")
    fields: dict = {}
    try:
        if "headers" in given:
            headers = access.headers_validate(given["headers"])
            fields["header_names"] = sorted(headers, key=str.lower)
            fields["encrypted_headers"] = crypto.encrypt(json.dumps(headers)) if headers else ""
        if "auth" in given:
            auth = access.auth_validate(given["auth"])
            if auth is not None and auth.type == EndpointAccess.OAUTH2:
                try:
                    endpoint_url_check(url=auth.shown["token_url"])
                except EndpointUrlRefused as exc:
                    raise access.AccessRefused("auth", f"token_url: {exc}") from None
            fields["auth_type"] = auth.type if auth else ""
            fields["auth_shown"] = auth.shown if auth else {}
            fields["encrypted_auth_secret"] = crypto.encrypt(auth.secret) if auth else ""
        if "client_certificate" in given:
            cert = access.client_certificate_validate(given["client_certificate"])
            fields["certificate"] = cert.certificate if cert else ""
            fields["certificate_subject"] = cert.subject if cert else ""
            fields["certificate_expires_at"] = cert.expires_at if cert else None
            fields["encrypted_private_key"] = crypto.encrypt(cert.private_key) if cert else ""
    except access.AccessRefused as exc:
        raise EndpointAccessRefused(exc.field, str(exc)) from None
    return fields


def endpoint_destination_fields(*, kind: str, url: str | None, given: dict,
                                current: EndpointAccess | None) -> tuple[str | None, dict]:
    """A broker endpoint's destination (SPEC §14): the URL as the endpoint shows it (without its user name and
    password; None if no URL is given) and the EndpointAccess columns (its kind and fields, merged over the
    `current` ones; its URL encrypted). The URL must be of the kind's schemes and, unless
    WEBHOOK_ALLOW_PRIVATE_NETWORKS, its host must resolve to public addresses only (EndpointUrlRefused; the worker
    checks again when it connects). A field of another kind is refused (EndpointAccessRefused), and so is any on
    an endpoint that is no broker. Nothing is written here."""
    module = BROKERS.get(kind)
    foreign = sorted(name for name in given if module is None or name not in module.fields)
    if foreign:
        raise EndpointAccessRefused(foreign[0], f"Not a field of a {kind} endpoint"
                                    + (f" (its fields: url, {', '.join(module.fields)})." if module else "."))
    if module is None:
        return None, {}
    if url is None and current is None:
        raise EndpointAccessRefused("url", "This field is required.")
    columns: dict = {}
    shown = None
    try:
        if url is not None:
            brokers.url_validate(module, url)
            if not herald_settings.delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS:
                try:
                    addresses.check_url_host(url, dns_timeout=herald_settings.delivery.ENDPOINT_DNS_TIMEOUT_SECONDS,
                                             ports=module.ports)
                except ValueError as exc:
                    raise EndpointUrlRefused(str(exc)) from None
            shown = brokers.url_without_credentials(url)
            columns["encrypted_url"] = crypto.encrypt(url)
        if given or current is None:
            options = {name: value for name, value in (current.destination if current else {}).items()
                       if name != "kind"}
            columns["destination"] = {"kind": kind, **module.options_validate(given, options)}
    except brokers.DestinationRefused as exc:
        raise EndpointAccessRefused(exc.field, str(exc)) from None
    return shown, columns


def _access_save(*, endpoint: Endpoint, fields: dict) -> None:
    """Write the access columns; a row left with nothing in it is deleted (the worker then finds none)."""
    if not fields:
        return
    row, _ = EndpointAccess.objects.select_for_update().get_or_create(endpoint=endpoint)
    for name, value in fields.items():
        setattr(row, name, value)
    if row.is_empty:
        row.delete()
    else:
        row.save()
    if Endpoint.access.related.is_cached(endpoint):  # the endpoint shows what was just written
        Endpoint.access.related.delete_cached_value(endpoint)


@transaction.atomic
def endpoint_update(*, endpoint: Endpoint, **changes) -> Endpoint:
    """Apply a partial update: only the named columns are written, so a concurrent breaker trip,
    failure mark or disable by a worker is never undone by a stale copy of the row.

    Re-enabling (or a new URL) starts the failure clock and the breaker afresh; disabling fails
    what was waiting; a higher cap, a new throttle or a change of ordering hands parked deliveries on
    at once (as many as the endpoint now has room for; the next claim applies the new rules). A new
    `filter` is compiled (FilterInvalid if it cannot be used) and applies to events taken from then on. A
    new `signature` scheme is a rotation: a key of that scheme signs from now on, and the current ones
    keep signing for 24 h beside it, so receivers can move over.
    """
    unknown = set(changes) - set(UPDATABLE_FIELDS)
    if unknown:
        raise TypeError(f"cannot update {sorted(unknown)}")
    broker = endpoint.kind in BROKERS
    if "url" in changes:
        if endpoint.kind == Endpoint.POLL:
            raise EndpointUrlRefused("A poll endpoint has no URL: its consumer reads its messages.")
        if not broker:
            endpoint_url_check(url=changes["url"])
    if "filter" in changes:
        changes["filter_path"] = _filter_path(changes["filter"])
    access_fields = endpoint_access_fields(kind=endpoint.kind,
                                           **{name: changes.pop(name) for name in ACCESS_FIELDS if name in changes})
    destination_given = {name: changes.pop(name) for name in DESTINATION_FIELDS if name in changes}
    destination: dict = {}
    if broker or destination_given:
        current = EndpointAccess.objects.filter(endpoint=endpoint).first()
        shown_url, destination = endpoint_destination_fields(kind=endpoint.kind, url=changes.get("url"),
                                                             given=destination_given, current=current)
        if shown_url is not None:
            changes["url"] = shown_url
    _access_save(endpoint=endpoint, fields={**access_fields, **destination})
    if "signature" in changes:
        current = Endpoint.objects.select_for_update().filter(pk=endpoint.pk).values_list("signature", flat=True).first()
        if current is not None and current != changes["signature"]:
            endpoint_rotate_secret(endpoint=endpoint, scheme=changes["signature"])
    fields = dict(changes)
    if changes.get("enabled") is True:
        fields.update(_FRESH_START, disabled_reason="")
    elif "url" in changes:
        fields.update(_FRESH_START)
    endpoints.endpoint_write(endpoint_id=endpoint.pk, **fields)
    if changes.get("enabled") is False:
        deliveries_fail_waiting(endpoint_id=endpoint.pk)
    elif {"enabled", "url", "max_in_flight", "throttle_rate", "ordering"} & set(changes):
        endpoint_hand_on(endpoint=endpoint)
    endpoint.refresh_from_db()
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint: Endpoint) -> int:
    """Soft-delete the endpoint (its delivery history stays readable) and cancel what is pending."""
    now = timezone.now()
    endpoints.endpoint_soft_delete(endpoint_id=endpoint.pk, now=now)
    cancelled = deliveries.cancel_pending(endpoint_id=endpoint.pk)
    outbox.drop_finished(endpoint_id=endpoint.pk)
    return cancelled


@transaction.atomic
def endpoint_rotate_secret(*, endpoint: Endpoint, scheme: str | None = None) -> Endpoint:
    """Issue a new secret (read it with `endpoint_secret`) of the endpoint's signature scheme (or of
    `scheme`, when it changes); the ones still active keep signing for 24 h, then expire."""
    now = timezone.now()
    EndpointSecret.objects.filter(endpoint=endpoint).filter(
        expires_at__isnull=True).update(expires_at=now + OLD_SECRET_GRACE)
    if scheme is None:
        scheme = Endpoint.objects.filter(pk=endpoint.pk).values_list("signature", flat=True).first() or Endpoint.V1
    _issue_secret(endpoint=endpoint, scheme=scheme)
    return endpoint


def _issue_secret(*, endpoint: Endpoint, scheme: str | None = None) -> EndpointSecret:
    key = generate_signing_key(scheme or endpoint.signature)
    return EndpointSecret.objects.create(endpoint=endpoint, encrypted_secret=crypto.encrypt(key))


def endpoints_disable_failing(*, now: datetime | None = None) -> int:
    """Beat: disable endpoints that have failed continuously for WEBHOOK_DISABLE_AFTER_SECONDS."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=herald_settings.delivery.WEBHOOK_DISABLE_AFTER_SECONDS)
    failing = Endpoint.objects.filter(enabled=True, deleted_at__isnull=True, failing_since__lte=cutoff)
    return sum(endpoint_disable(endpoint_id=endpoint_id, reason="failing continuously")
               for endpoint_id in failing.values_list("id", flat=True))
