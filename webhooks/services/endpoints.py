"""Endpoint services: create, update, disable, delete (cancelling pending deliveries), rotate the secret."""
import json
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from webhooks import access, crypto, event_types
from webhooks.conf import herald_settings
from webhooks.delivery import outbox
from webhooks.delivery.parked import endpoint_hand_on
from webhooks.models import Delivery, DeliveryLease, Endpoint, EndpointAccess, EndpointSecret, Tenant
from webhooks.services.events import event_emit_operational
from webhooks.signing import generate_secret
from webhooks.transport import check_url_host

# How long a rotated-out secret keeps signing, so receivers can roll over (Svix does the same).
OLD_SECRET_GRACE = timedelta(hours=24)

# The breaker and failure clock of an endpoint that starts afresh (re-enabled, or pointed elsewhere).
_FRESH_START = {"failing_since": None, "consecutive_failures": 0, "tripped_at": None, "next_probe_at": None,
                "failed_probes": 0}

_DELIVERY = Delivery._meta.db_table
_ENDPOINT = Endpoint._meta.db_table


class EndpointUrlRefused(ValueError):
    """The URL is not http(s), carries credentials, or its host resolves (in time) to no address Herald may
    call."""


def endpoint_url_check(*, url: str) -> None:
    """Refuse URLs that are not http(s), that carry a user name or password, or (unless allowed) that point
    into private networks or whose DNS lookup takes longer than ENDPOINT_DNS_TIMEOUT_SECONDS."""
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
        check_url_host(url, dns_timeout=herald_settings.delivery.ENDPOINT_DNS_TIMEOUT_SECONDS)
    except ValueError as exc:
        raise EndpointUrlRefused(str(exc)) from None


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
                    ordering: str = Endpoint.UNORDERED, kind: str = Endpoint.HTTP, **access_given) -> Endpoint:
    """Create an endpoint with a fresh `whsec_` secret (read it with `endpoint_secret`), within the
    tenant's `max_endpoints`, and its access (`headers`, `auth`, `client_certificate`: see
    `endpoint_access_fields`) if given. A poll endpoint has no URL: Herald never connects anywhere for it
    (nor takes access for it).

    The count is taken under the tenant's row lock (FOR NO KEY UPDATE: intake's inserts, which take
    FOR KEY SHARE on it for their foreign key, do not wait for it), so two creates at the limit
    cannot both pass; a deletion of the tenant waits for it too, and then takes the new endpoint down
    with the others.
    """
    if kind == Endpoint.POLL:
        if url:
            raise EndpointUrlRefused("A poll endpoint has no URL: its consumer reads its messages.")
    else:
        endpoint_url_check(url=url)  # (a DNS lookup: before the lock)
    access_fields = endpoint_access_fields(poll=kind == Endpoint.POLL, **access_given)  # every check first
    locked = Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk, deleted_at__isnull=True).first()
    if locked is None:
        raise TenantGone(tenant.pk)
    limit = tenant_max_endpoints(locked)
    if Endpoint.objects.filter(tenant=locked, deleted_at__isnull=True).count() >= limit:
        raise EndpointQuotaExceeded(
            f"This tenant already has its {limit} endpoints (max_endpoints); delete one, or ask for a higher limit.")
    endpoint = Endpoint.objects.create(tenant=tenant, kind=kind, url=url, event_types=event_types, channels=channels,
                                       description=description, max_in_flight=max_in_flight,
                                       throttle_rate=throttle_rate, ordering=ordering)
    _issue_secret(endpoint=endpoint)
    _access_save(endpoint=endpoint, fields=access_fields)
    return endpoint


ACCESS_FIELDS = ("headers", "auth", "client_certificate")
UPDATABLE_FIELDS = ("url", "event_types", "channels", "description", "enabled", "max_in_flight", "throttle_rate",
                    "ordering") + ACCESS_FIELDS


class EndpointAccessRefused(ValueError):
    """Headers, auth or a client certificate that cannot be used (`field` names which)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def endpoint_access_fields(*, poll: bool = False, **given) -> dict:
    """The EndpointAccess columns for what is given of `headers`, `auth` and `client_certificate` (each
    replaces the endpoint's whole current value; null or {} removes it), checked and with every secret
    encrypted. EndpointAccessRefused when one cannot be used; nothing is written here. A poll endpoint
    (`poll`) is never POSTed to: any of them given non-empty is refused."""
    unknown = set(given) - set(ACCESS_FIELDS)
    if unknown:
        raise TypeError(f"unknown access fields {sorted(unknown)}")
    if poll:
        for name in ACCESS_FIELDS:
            if given.get(name):
                raise EndpointAccessRefused(name, "A poll endpoint is never POSTed to: it takes no headers, auth "
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
    at once (as many as the endpoint now has room for; the next claim applies the new rules).
    """
    unknown = set(changes) - set(UPDATABLE_FIELDS)
    if unknown:
        raise TypeError(f"cannot update {sorted(unknown)}")
    if "url" in changes:
        if endpoint.kind == Endpoint.POLL:
            raise EndpointUrlRefused("A poll endpoint has no URL: its consumer reads its messages.")
        endpoint_url_check(url=changes["url"])
    access_fields = endpoint_access_fields(poll=endpoint.kind == Endpoint.POLL,
                                           **{name: changes.pop(name) for name in ACCESS_FIELDS if name in changes})
    _access_save(endpoint=endpoint, fields=access_fields)
    fields = dict(changes)
    if changes.get("enabled") is True:
        fields.update(_FRESH_START, disabled_reason="")
    elif "url" in changes:
        fields.update(_FRESH_START)
    Endpoint.objects.filter(pk=endpoint.pk, deleted_at__isnull=True).update(**fields, updated_at=timezone.now())
    if changes.get("enabled") is False:
        _fail_waiting(endpoint_id=endpoint.pk)
    elif {"enabled", "url", "max_in_flight", "throttle_rate", "ordering"} & set(changes):
        endpoint_hand_on(endpoint=endpoint)
    endpoint.refresh_from_db()
    return endpoint


def _fail_waiting(*, endpoint_id: str) -> int:
    """A disabled endpoint receives nothing: what waits for it (not in flight) is failed now."""
    in_flight = DeliveryLease.objects.filter(delivery=OuterRef("pk"), until__gt=Now())
    failed = Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.PENDING).exclude(
        Exists(in_flight)).update(status=Delivery.FAILED, next_attempt_at=None, parked_at=None, updated_at=Now())
    outbox.drop_finished(endpoint_id=endpoint_id)
    return failed


@transaction.atomic
def endpoint_disable(*, endpoint_id: str, reason: str, notify: bool = True) -> bool:
    """Disable an enabled endpoint for `reason`, fail what waits for it, and tell the tenant with a
    `herald.endpoint.disabled` event (SPEC §8) unless `notify` is off. False if it was not enabled."""
    row = Endpoint.objects.filter(pk=endpoint_id, enabled=True, deleted_at__isnull=True)
    found = list(row.values_list("tenant_id", "url"))
    if not found or not row.update(enabled=False, disabled_reason=reason, updated_at=timezone.now()):
        return False
    _fail_waiting(endpoint_id=endpoint_id)
    if notify:
        tenant_id, url = found[0]
        event_emit_operational(tenant_id=tenant_id, event_type=event_types.ENDPOINT_DISABLED,
                               data={"endpoint_id": endpoint_id, "url": url, "reason": reason})
    return True


@transaction.atomic
def endpoint_delete(*, endpoint: Endpoint) -> int:
    """Soft-delete the endpoint (its delivery history stays readable) and cancel what is pending."""
    now = timezone.now()
    Endpoint.objects.filter(pk=endpoint.pk).update(deleted_at=now, enabled=False, updated_at=now)
    cancelled = Delivery.objects.filter(endpoint=endpoint, status=Delivery.PENDING).update(
        status=Delivery.CANCELLED, next_attempt_at=None, parked_at=None, updated_at=now)
    outbox.drop_finished(endpoint_id=endpoint.pk)
    return cancelled


@transaction.atomic
def endpoint_rotate_secret(*, endpoint: Endpoint) -> Endpoint:
    """Issue a new secret (read it with `endpoint_secret`); the ones still active keep signing for 24 h,
    then expire."""
    now = timezone.now()
    EndpointSecret.objects.filter(endpoint=endpoint).filter(
        expires_at__isnull=True).update(expires_at=now + OLD_SECRET_GRACE)
    _issue_secret(endpoint=endpoint)
    return endpoint


def _issue_secret(*, endpoint: Endpoint) -> EndpointSecret:
    return EndpointSecret.objects.create(endpoint=endpoint, encrypted_secret=crypto.encrypt(generate_secret()))


def endpoints_disable_failing(*, now: datetime | None = None) -> int:
    """Beat: disable endpoints that have failed continuously for WEBHOOK_DISABLE_AFTER_SECONDS."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=herald_settings.delivery.WEBHOOK_DISABLE_AFTER_SECONDS)
    failing = Endpoint.objects.filter(enabled=True, deleted_at__isnull=True, failing_since__lte=cutoff)
    return sum(endpoint_disable(endpoint_id=endpoint_id, reason="failing continuously")
               for endpoint_id in failing.values_list("id", flat=True))
