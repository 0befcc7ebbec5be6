"""The tenant portal: server-rendered pages for a tenant's own people, opened from a one-time link.

Every read goes through webhooks.selectors (scoped to the session's tenant: another tenant's object is
404) and every write through the same services and input validation as the REST API; this module
holds no business rule of its own. Forms carry Django's CSRF token; the session (HttpOnly, SameSite
Lax, Secure over https) ends on logout or PORTAL_SESSION_SECONDS after the link was opened.
"""
import json
import time
from datetime import timedelta
from functools import wraps

from django.contrib import messages
from django.db import transaction
from django.db.models import Count
from django.db.models.functions import TruncHour
from django.middleware.csrf import rotate_token
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from intake import serializers as io
from webhooks import ids, selectors
from webhooks.conf import herald_settings
from webhooks.delivery import retries
from webhooks.filters import FilterInvalid
from webhooks.models import Delivery, Endpoint, Tenant
from webhooks.services import endpoints as endpoint_services
from webhooks.services import events as event_services
from webhooks.services import recovery as recovery_services
from webhooks.services.portal import portal_link_redeem, portal_link_usable, portal_session_tenant

SESSION_TENANT, SESSION_SINCE, SESSION_LINK = "portal_tenant", "portal_since", "portal_link"
SESSION_THEME = "portal_theme"  # the link's {name?, logo_url?, accent?} (checked by the API), for base.html
OUTCOMES = ("succeeded", "failed", "pending", "cancelled")


def _refused(request, title: str, detail: str, status: int):
    return render(request, "portal/refused.html", {"title": title, "detail": detail}, status=status)


def _not_found(request):
    return _refused(request, "Not found", "There is nothing here for your organisation.", 404)


class _NotTheirs(Exception):
    """Nothing of that id belongs to the session's tenant (or it was deleted meanwhile): a 404 page."""


def _own(found):
    """A selector's answer (already scoped to the tenant), or the 404 page."""
    if found is None:
        raise _NotTheirs
    return found


def tenant_view(view):
    """The view runs with `request.tenant` from the session, or the visitor is told to ask for a new link."""
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        tenant_id, since = request.session.get(SESSION_TENANT), request.session.get(SESSION_SINCE, 0)
        # The session ends with its time, with its tenant (deleted) and with the credential that made
        # its link (revoked): SPEC §10.
        tenant = None
        if tenant_id is not None and time.time() - since <= herald_settings.portal.PORTAL_SESSION_SECONDS:
            tenant = portal_session_tenant(link_id=request.session.get(SESSION_LINK), tenant_id=tenant_id)
        if tenant is None:
            request.session.flush()
            return _refused(request, "Your portal session has ended",
                            "Ask for a new portal link to come back.", 403)
        request.tenant = tenant
        request.portal_theme = request.session.get(SESSION_THEME) or {}
        try:
            return view(request, *args, **kwargs)
        except (_NotTheirs, Delivery.DoesNotExist):  # (a delivery deleted by retention while resent)
            return _not_found(request)
    return wrapper


@require_http_methods(["GET", "POST"])
def open_link(request, token: str):
    """GET shows a button; its POST redeems the link. Mail scanners and chat unfurlers fetch links with
    GET: were GET to redeem it, the person it was meant for would find it used."""
    if request.method == "GET":
        if not portal_link_usable(token=token):
            return _link_refused(request)
        return render(request, "portal/open.html")
    opened = portal_link_redeem(token=token)
    if opened is None:
        return _link_refused(request)
    link_id, tenant_id, theme = opened
    request.session.flush()  # a fresh session id: nothing carried over from before the link
    rotate_token(request)  # and a fresh CSRF token: one planted before the link was opened is worth nothing
    request.session[SESSION_TENANT], request.session[SESSION_SINCE] = tenant_id, time.time()
    request.session[SESSION_LINK] = link_id
    request.session[SESSION_THEME] = theme
    request.session.set_expiry(herald_settings.portal.PORTAL_SESSION_SECONDS)
    return redirect("portal:endpoints")


def _link_refused(request):
    return _refused(request, "This link cannot be used",
                    "A portal link opens once, within a few minutes of being made. Ask for a new one.", 410)


@require_POST
def logout(request):
    request.session.flush()
    return _refused(request, "Signed out", "Your portal session has ended.", 200)


def _chart(tenant: Tenant, endpoint_ids: list[str]) -> dict[str, list[dict]]:
    """Per endpoint, 24 hourly bars of its deliveries by outcome (ids are ULIDs: the last day is an id range)."""
    now = timezone.now()
    since = (now - timedelta(hours=23)).replace(minute=0, second=0, microsecond=0)
    rows = (Delivery.objects.filter(tenant=tenant, endpoint_id__in=endpoint_ids, id__gte=ids.boundary("dlv", since))
            .annotate(hour=TruncHour("created_at")).values("endpoint_id", "hour", "status")
            .annotate(n=Count("id")))
    counts = {(row["endpoint_id"], row["hour"], row["status"]): row["n"] for row in rows}
    hours = [since + timedelta(hours=h) for h in range(24)]
    peak = max(counts.values(), default=0) or 1
    chart = {}
    for endpoint_id in endpoint_ids:
        bars = []
        for x, hour in enumerate(hours):
            y, stack = 40.0, []
            for outcome in OUTCOMES:
                n = counts.get((endpoint_id, hour, outcome), 0)
                if n:
                    height = 40.0 * n / peak
                    y -= height
                    stack.append({"outcome": outcome, "n": n, "y": round(y, 1), "height": round(height, 1)})
            bars.append({"x": x * 10, "hour": hour, "stack": stack})
        chart[endpoint_id] = bars
    return chart


@tenant_view
@require_http_methods(["GET"])
def endpoints(request):
    rows = list(selectors.endpoint_list(tenant=request.tenant).order_by("-id"))
    chart = _chart(request.tenant, [endpoint.pk for endpoint in rows])
    return render(request, "portal/endpoints.html", {
        "endpoints": [{"endpoint": endpoint, "bars": chart[endpoint.pk]} for endpoint in rows]})


def _form_data(post) -> dict:
    """The endpoint form's fields as the API's input takes them (lists from comma-separated text; the
    event types also from the catalog's checkboxes, ticked ones first)."""
    data = {}
    for name in ("url", "description", "ordering", "kind"):
        if name in post:
            data[name] = post[name].strip()
    # a broker's fields (SPEC §14): only those filled in (the form shows every kind's on a new endpoint)
    for name in ("exchange", "routing_key", "stream", "subject"):
        if post.get(name, "").strip() or (name == "exchange" and "exchange" in post and post.get("kind") == "amqp"):
            data[name] = post[name].strip()
    if post.get("maxlen", "").strip():
        data["maxlen"] = post["maxlen"].strip()
    for name in ("event_types", "channels"):
        if name in post:
            data[name] = [item.strip() for item in post[name].split(",") if item.strip()]
    if "event_types" in post:
        data["event_types"] = list(dict.fromkeys(
            [name.strip() for name in post.getlist("catalog_type") if name.strip()] + data["event_types"]))
    for name in ("max_in_flight", "throttle_rate"):
        if name in post:
            data[name] = post[name].strip() or None
    if "signature" in post:
        data["signature"] = post["signature"]
    if "filter" in post:  # JSON text; empty: no filter. Text that is not JSON goes on as a string, refused below.
        text = post["filter"].strip()
        try:
            data["filter"] = json.loads(text) if text else None
        except ValueError:
            data["filter"] = text
    if "enabled" in post:
        data["enabled"] = post["enabled"] == "on"
    return data


def _filter_error(exc: FilterInvalid) -> str:
    return f"{exc.pointer or '/'}: {exc}"


def _form(endpoint: Endpoint | None, values: dict | None) -> dict:
    """What the endpoint form's fields show: what was just submitted, else the endpoint's own values. The
    catalog's types are offered as checkboxes (`catalog`: name, description, ticked); the text field holds
    the other types and patterns (`invoice.*`)."""
    def raw(name, default=""):
        return (values or {}).get(name, getattr(endpoint, name, default) if endpoint is not None else default)

    def shown(name, default=""):
        value = raw(name, default)
        if isinstance(value, list):
            return ", ".join(value)
        return "" if value is None else str(value)
    catalog = list(selectors.event_type_list().values_list("name", "description"))
    names = {name for name, _ in catalog}
    chosen = raw("event_types", []) or []
    form = {name: shown(name) for name in ("url", "description", "channels", "max_in_flight", "throttle_rate")}
    access = selectors.endpoint_access(endpoint=endpoint) if endpoint is not None else None
    destination = access.destination if access is not None else {}
    form["kind"] = (values or {}).get("kind", endpoint.kind if endpoint is not None else Endpoint.HTTP)
    form["kinds"] = [kind for kind, _ in Endpoint.KINDS if kind != Endpoint.POLL]
    for name in ("exchange", "routing_key", "stream", "maxlen", "subject"):
        value = (values or {}).get(name, destination.get(name))
        form[name] = "" if value is None else str(value)
    chosen_filter = raw("filter", None)
    form["filter"] = (chosen_filter if isinstance(chosen_filter, str)
                      else "" if chosen_filter is None else json.dumps(chosen_filter, indent=1, ensure_ascii=False))
    return form | {"ordering": shown("ordering", Endpoint.UNORDERED), "signature": shown("signature", Endpoint.V1),
                   "event_types": ", ".join(item for item in chosen if item not in names),
                   "catalog": [{"name": name, "description": description, "ticked": name in chosen}
                               for name, description in catalog]}


def _errors(serializer) -> dict[str, str]:
    return {field: " ".join(str(message) for message in messages_) if isinstance(messages_, list) else str(messages_)
            for field, messages_ in serializer.errors.items()}


@tenant_view
@require_http_methods(["GET", "POST"])
def endpoint_new(request):
    values, errors = {}, {}
    if request.method == "POST":
        values = _form_data(request.POST)
        form = io.EndpointCreateInput(data=values)
        if form.is_valid():
            try:
                endpoint = endpoint_services.endpoint_create(tenant=request.tenant, **form.validated_data)
            except endpoint_services.EndpointUrlRefused as exc:
                errors = {"url": str(exc)}
            except endpoint_services.EndpointAccessRefused as exc:
                errors = {exc.field: str(exc)}
            except endpoint_services.EndpointQuotaExceeded as exc:
                errors = {"url": str(exc)}
            except FilterInvalid as exc:
                errors = {"filter": _filter_error(exc)}
            else:
                messages.success(request, "Endpoint created. Reveal its signing secret below.")
                return redirect("portal:endpoint", endpoint.pk)
        else:
            errors = _errors(form)
    return render(request, "portal/endpoint_form.html", {"form": _form(None, values), "errors": errors},
                  status=400 if errors else 200)


def _endpoint_page(request, endpoint: Endpoint, *, values=None, errors=None, secret=None, status=200,
                   access_errors=None):
    recent = selectors.delivery_list(tenant=request.tenant, endpoint_id=endpoint.pk).select_related("event")[:20]
    return render(request, "portal/endpoint.html", {
        "endpoint": endpoint, "form": _form(endpoint, values), "errors": errors or {}, "secret": secret,
        # a v1a endpoint's public key is no secret: shown at once (its private key never is)
        "public_key": (selectors.endpoint_secret_shown(endpoint=endpoint).get("public_key")
                       if endpoint.signature == Endpoint.V1A else None),
        "recent": recent, "recovery": selectors.recovery_latest(tenant=request.tenant, endpoint_id=endpoint.pk),
        "recover_since": (values or {}).get("since", ""),
        "access": selectors.endpoint_access(endpoint=endpoint), "access_errors": access_errors or {},
        "bars": _chart(request.tenant, [endpoint.pk])[endpoint.pk],
        "max_in_flight": endpoint_services.endpoint_max_in_flight(endpoint)}, status=status)


@tenant_view
@require_http_methods(["GET", "POST"])
def endpoint_detail(request, endpoint_id: str):
    endpoint = _own(selectors.endpoint_get(tenant=request.tenant, endpoint_id=endpoint_id))
    if request.method == "GET":
        return _endpoint_page(request, endpoint)
    values = _form_data(request.POST)
    values.pop("kind", None)  # set once, at creation
    if "enabled" not in request.POST and request.POST.get("form") == "edit":
        values["enabled"] = False  # an unticked checkbox sends nothing
    if endpoint.kind != Endpoint.HTTP and values.get("url") == endpoint.url:
        del values["url"]  # a broker's URL as shown, without its credentials: unchanged (they are kept)
    form = io.EndpointUpdateInput(data=values, partial=True)
    if not form.is_valid():
        return _endpoint_page(request, endpoint, values=values, errors=_errors(form), status=400)
    try:
        endpoint_services.endpoint_update(endpoint=endpoint, **form.validated_data)
    except endpoint_services.EndpointUrlRefused as exc:
        return _endpoint_page(request, endpoint, values=values, errors={"url": str(exc)}, status=400)
    except endpoint_services.EndpointAccessRefused as exc:
        return _endpoint_page(request, endpoint, values=values, errors={exc.field: str(exc)}, status=400)
    except FilterInvalid as exc:
        return _endpoint_page(request, endpoint, values=values, errors={"filter": _filter_error(exc)}, status=400)
    messages.success(request, "Endpoint saved.")
    return redirect("portal:endpoint", endpoint.pk)


def _headers_from_text(text: str) -> dict | str:
    """`Name: value` lines (the form's textarea) as the API's `headers` object, or why they are not."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep:
            return f"Line {number} is not `Name: value`."
        if name.strip() in headers:
            return f"Header {name.strip()!r} is given twice."
        headers[name.strip()] = value.strip()
    return headers


def _auth_from_form(post) -> dict | None:
    kind = post.get("auth_type", "")
    if not kind:
        return None
    names = {"basic": ("username", "password"), "bearer": ("token",),
             "oauth2_client_credentials": ("token_url", "client_id", "client_secret", "scope", "audience")}
    return {"type": kind, **{name: post.get(name, "").strip() for name in names.get(kind, ()) if post.get(name, "").strip()}}


@tenant_view
@require_POST
def endpoint_access(request, endpoint_id: str):
    """Replace the endpoint's extra headers, its auth or its client certificate (one form each); what is set is
    never shown again (the page lists header names, the auth without its secret, the certificate's subject)."""
    endpoint = _own(selectors.endpoint_get(tenant=request.tenant, endpoint_id=endpoint_id))
    part = request.POST.get("part")
    if part == "headers":
        headers = _headers_from_text(request.POST.get("headers", ""))
        if isinstance(headers, str):
            return _endpoint_page(request, endpoint, access_errors={"headers": headers}, status=400)
        change = {"headers": headers or None}
    elif part == "auth":
        change = {"auth": _auth_from_form(request.POST)}
    elif part == "certificate":
        change = {"client_certificate": {"certificate": request.POST.get("certificate", ""),
                                         "private_key": request.POST.get("private_key", "")}}
    elif part == "certificate-remove":
        change = {"client_certificate": None}
    else:
        return _endpoint_page(request, endpoint, access_errors={"form": "Unknown form."}, status=400)
    try:
        endpoint_services.endpoint_update(endpoint=endpoint, **change)
    except endpoint_services.EndpointAccessRefused as exc:
        return _endpoint_page(request, endpoint, access_errors={exc.field: str(exc)}, status=400)
    messages.success(request, "Saved. What you entered is stored encrypted and is not shown again.")
    return redirect("portal:endpoint", endpoint.pk)


@tenant_view
@require_POST
def endpoint_secret(request, endpoint_id: str):
    """The secret, shown on an explicit click (a POST: never in a link, a history entry or a cache)."""
    endpoint = _own(selectors.endpoint_get(tenant=request.tenant, endpoint_id=endpoint_id))
    response = _endpoint_page(request, endpoint, secret=selectors.endpoint_secret_shown(endpoint=endpoint).get("secret"))
    response["Cache-Control"] = "no-store"
    return response


@tenant_view
@require_POST
def endpoint_rotate(request, endpoint_id: str):
    endpoint = _own(selectors.endpoint_get(tenant=request.tenant, endpoint_id=endpoint_id))
    endpoint_services.endpoint_rotate_secret(endpoint=endpoint)
    messages.success(request, "A new secret signs from now on; the previous one keeps signing for 24 hours.")
    return redirect("portal:endpoint", endpoint.pk)


@tenant_view
@require_POST
def endpoint_test(request, endpoint_id: str):
    endpoint = _own(selectors.endpoint_get(tenant=request.tenant, endpoint_id=endpoint_id))
    with transaction.atomic():
        event = event_services.event_send_test(endpoint=endpoint)
    messages.success(request, "Test event sent.")
    return redirect("portal:event", event.pk)


@tenant_view
@require_POST
def endpoint_recover(request, endpoint_id: str):
    """"Resend all failed since …": a recovery (SPEC §11) of the endpoint, followed on its own page."""
    endpoint = _own(selectors.endpoint_get(tenant=request.tenant, endpoint_id=endpoint_id))
    values = {name: request.POST[name].strip() for name in ("since", "until") if request.POST.get(name, "").strip()}
    form = io.RecoveryCreateInput(data=values)
    if not form.is_valid():
        return _endpoint_page(request, endpoint, values=values, errors=_errors(form), status=400)
    try:
        with transaction.atomic():
            recovery = recovery_services.recovery_create(tenant=request.tenant, endpoint=endpoint,
                                                         **form.validated_data)
    except recovery_services.RecoveryRefused as exc:
        return _endpoint_page(request, endpoint, values=values, errors={"since": str(exc)}, status=409)
    messages.success(request, f"Resending {recovery.total} failed deliveries.")
    return redirect("portal:recovery", recovery.pk)


@tenant_view
@require_http_methods(["GET"])
def recovery_detail(request, recovery_id: str):
    """A recovery's progress; the page reloads itself while it runs."""
    recovery = _own(selectors.recovery_get(tenant=request.tenant, recovery_id=recovery_id))
    return render(request, "portal/recovery.html", {"recovery": recovery})


def _created_range(request) -> tuple[dict, dict[str, str]]:
    """The lists' `created_after` / `created_before` fields (UTC), validated as the API does."""
    values = {name: request.GET[name].strip() for name in ("created_after", "created_before")
              if request.GET.get(name, "").strip()}
    form = io.CreatedRangeInput(data=values)
    if not form.is_valid():
        return {}, _errors(form)
    return form.validated_data, {}


@tenant_view
@require_http_methods(["GET"])
def deliveries(request):
    filters = io.DeliveryFilterInput(data={k: v for k, v in request.GET.items() if k in ("status", "endpoint") and v})
    chosen = filters.validated_data if filters.is_valid() else {}
    created, errors = _created_range(request)
    rows = selectors.delivery_list(tenant=request.tenant, status=chosen.get("status"),
                                   endpoint_id=chosen.get("endpoint"), **created)
    event_type = request.GET.get("type", "").strip()
    if event_type:
        rows = rows.filter(event__type=event_type)
    return render(request, "portal/deliveries.html", {
        "deliveries": rows.select_related("event", "endpoint").order_by("-id")[:50],
        "endpoints": selectors.endpoint_list(tenant=request.tenant).order_by("url"),
        "statuses": [status for status, _ in Delivery.STATUSES], "errors": errors,
        "chosen": {"status": chosen.get("status", ""), "endpoint": chosen.get("endpoint", ""), "type": event_type,
                   "created_after": request.GET.get("created_after", ""),
                   "created_before": request.GET.get("created_before", "")}},
                  status=400 if errors else 200)


@tenant_view
@require_http_methods(["GET"])
def delivery_detail(request, delivery_id: str):
    delivery = _own(selectors.delivery_get(tenant=request.tenant, delivery_id=delivery_id))
    return render(request, "portal/delivery.html", {"delivery": delivery, "attempts": delivery.attempts.all()})


@tenant_view
@require_POST
def delivery_resend(request, delivery_id: str):
    delivery = _own(selectors.delivery_get(tenant=request.tenant, delivery_id=delivery_id))
    delivery = retries.delivery_retry(delivery=delivery)
    messages.success(request, "Sent again." if delivery.status == Delivery.PENDING else "It is still being sent.")
    return redirect("portal:delivery", delivery.pk)


@tenant_view
@require_http_methods(["GET"])
def events(request):
    event_type = request.GET.get("type", "").strip()
    created, errors = _created_range(request)
    rows = selectors.event_list(tenant=request.tenant, event_type=event_type or None, **created).order_by("-id")[:50]
    return render(request, "portal/events.html", {"events": rows, "errors": errors, "chosen": {
        "type": event_type, "created_after": request.GET.get("created_after", ""),
        "created_before": request.GET.get("created_before", "")}}, status=400 if errors else 200)


@tenant_view
@require_http_methods(["GET"])
def event_detail(request, event_id: str):
    event = _own(selectors.event_get(tenant=request.tenant, event_id=event_id))
    return render(request, "portal/event.html", {
        "event": event, "payload": json.dumps(event.data, indent=2, ensure_ascii=False),
        "deliveries": selectors.delivery_list(tenant=request.tenant, event_id=event.pk).select_related("event")})


@tenant_view
@require_http_methods(["GET"])
def event_types(request):
    """The deployment's event-type catalog: what each type means, its schema and an example of its data."""
    rows = [{"type": event_type,
             "schema": None if event_type.schema is None else json.dumps(event_type.schema, indent=2, ensure_ascii=False),
             "example": None if event_type.example is None else json.dumps(event_type.example, indent=2,
                                                                             ensure_ascii=False)}
            for event_type in selectors.event_type_list().order_by("name")]
    return render(request, "portal/event_types.html", {"event_types": rows})
