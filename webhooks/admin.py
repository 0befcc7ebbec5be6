"""Admin dashboard for tenants, endpoints, events and deliveries: views over the models, writes via services."""
import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.db.models.expressions import RawSQL
from django.forms.fields import InvalidJSONInput
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import ngettext

from webhooks import filters
from webhooks.delivery import outbox, retries
from webhooks.models import (Delivery, DeliveryAttempt, DeliveryLease, Endpoint, EndpointSecret, Event, EventType,
                              Recovery, Tenant)
from webhooks.selectors import endpoint_access
from webhooks.services import event_catalog
from webhooks.delivery.destinations.kinds import BROKERS
from webhooks.services.endpoints import (DESTINATION_FIELDS, EndpointAccessRefused, EndpointUrlRefused,
                                         endpoint_destination_fields, endpoint_filter_check, endpoint_update)

admin.site.site_header = "Herald administration"
admin.site.site_title = "Herald"
admin.site.index_title = "Tenants, endpoints, events and deliveries"


class CappedCountPaginator(Paginator):
    """Counts at most CAP rows (one LIMITed subquery, which an index answers), never a whole table of
    millions: the page links stop at CAP rows; filters and the id search reach the rest."""

    CAP = 2_000

    @cached_property
    def count(self) -> int:
        return self.object_list[: self.CAP].count()


class _LeanChangeList(ChangeList):
    """A changelist that does not load the big columns (bodies, JSON data) it never shows."""

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.defer(*self.model_admin.changelist_defer)


class _LeanChangeListMixin:
    changelist_defer: tuple[str, ...] = ()
    paginator = CappedCountPaginator
    show_full_result_count = False

    def get_changelist(self, request, **kwargs):
        return _LeanChangeList


class _ReadOnlyMixin:
    """History is written by the delivery machinery only: the admin may look, never add/change/delete."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    """Tenants with the platform's `uid` and `metadata` (SPEC §10); a deleted one awaits its erasure by beat."""

    list_display = ("name", "uid", "id", "max_endpoints", "delivery_weight", "waiting", "oldest_waiting",
                    "created_at", "deleted_at")
    list_filter = (("deleted_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "uid__exact", "id__exact")
    fields = ("name", "uid", "id", "max_endpoints", "delivery_weight", "waiting", "oldest_waiting", "metadata",
              "created_at", "deleted_at")
    readonly_fields = ("id", "uid", "waiting", "oldest_waiting", "created_at", "deleted_at")

    def get_queryset(self, request):
        # Deliveries due and waiting for the relays' fair choice (docs/design.md, "How a delivery is chosen"):
        # one index probe per tenant shown, and at most 1,000 index entries.
        column = f"{Tenant._meta.db_table}.id"
        return super().get_queryset(request).annotate(
            waiting_count=RawSQL(outbox.WAITING_OF_TENANT.format(tenant=column), ()),
            oldest_waiting_at=RawSQL(outbox.OLDEST_WAITING_OF_TENANT.format(tenant=column), ()))

    @admin.display(description="waiting", ordering="-waiting_count")
    def waiting(self, tenant) -> str:
        """Its deliveries due and not yet published (1000+ means at least that many)."""
        count = getattr(tenant, "waiting_count", 0) or 0
        return "1000+" if count >= 1000 else str(count)

    @admin.display(description="oldest waiting since", ordering="oldest_waiting_at")
    def oldest_waiting(self, tenant):
        return getattr(tenant, "oldest_waiting_at", None)


class EndpointSecretInline(_ReadOnlyMixin, admin.TabularInline):
    model = EndpointSecret
    verbose_name_plural = "signing secrets"
    # Never the secret, nor its ciphertext: the tenant reads it from the API (`GET …/secret`) only.
    fields = ("id", "created_at", "expires_at")
    readonly_fields = fields
    extra = 0


class _FilterField(forms.JSONField):
    """JSON text, refused (not a 500) when it nests past what Python's parser can take, and shown again as the
    operator wrote it even then, or when it holds an unpaired surrogate (`\\ud800`, which UTF-8 cannot carry)."""

    def to_python(self, value):
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(f"A filter nests at most {filters.FILTER_MAX_DEPTH} levels.") from None

    def bound_data(self, data, initial):
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)

    def prepare_value(self, value):
        shown = super().prepare_value(value)
        try:
            shown.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(value, cls=self.encoder)   # \\uXXXX escapes throughout
        return shown


class EndpointAdminForm(forms.ModelForm):
    """The endpoint as ops edit it, held to what the API holds it to: the payload filter goes through the check
    creating or updating an endpoint runs (webhooks/filters.py, then PostgreSQL's parse of its jsonpath), so
    nothing saved here fails on the way to the database; the cap and the throttle have the API's bounds."""

    filter = _FilterField(required=False)
    max_in_flight = forms.IntegerField(min_value=1, max_value=Endpoint.MAX_IN_FLIGHT_MAX, required=False)
    throttle_rate = forms.IntegerField(min_value=1, max_value=Endpoint.THROTTLE_RATE_MAX, required=False)
    # A broker endpoint's fields (SPEC §14; its URL and credentials only through the API or the portal), each
    # checked by its kind's module as the API checks them (`endpoint_destination_fields`).
    exchange = forms.CharField(max_length=255, required=False, strip=False)
    routing_key = forms.CharField(max_length=255, required=False, strip=False)
    stream = forms.CharField(max_length=512, required=False, strip=False)
    maxlen = forms.IntegerField(min_value=1, max_value=10_000_000, required=False)
    subject = forms.CharField(max_length=255, required=False, strip=False)

    class Meta:
        model = Endpoint
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        access = endpoint_access(endpoint=self.instance) if self.instance.pk else None
        for name, value in (access.destination if access else {}).items():
            if name in self.fields and name != "kind":
                self.initial[name] = value

    def clean(self):
        cleaned = super().clean()
        kind = self.instance.kind
        if kind in BROKERS:
            given = {name: cleaned.get(name) for name in BROKERS[kind].fields if name in self.changed_data}
            try:
                endpoint_destination_fields(kind=kind, url=None, given=given,
                                            current=endpoint_access(endpoint=self.instance))
            except (EndpointAccessRefused, EndpointUrlRefused) as exc:
                self.add_error(getattr(exc, "field", None) if getattr(exc, "field", None) in self.fields else None,
                               str(exc))
        return cleaned

    def clean_filter(self):
        value = self.cleaned_data.get("filter")
        try:
            endpoint_filter_check(value)
        except filters.FilterInvalid as exc:
            raise forms.ValidationError(f"{exc.pointer or '/'}: {exc}") from None
        return value


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    """Endpoints are created, rotated and deleted by tenants through the API; here ops may only
    enable/disable one, set its in-flight cap, throttle, ordering or payload filter, or fix its description (through `endpoint_update`,
    which clears the failure record and the breaker on re-enable)."""

    list_display = ("id", "tenant", "url", "enabled", "health", "consecutive_failures", "disabled_reason",
                    "created_at")
    list_filter = ("enabled", ("tripped_at", admin.EmptyFieldListFilter), "tenant")
    list_select_related = ("tenant",)
    search_fields = ("url", "id")
    fields = ("id", "tenant", "kind", "url", "description", "event_types", "channels", "enabled", "disabled_reason",
              "max_in_flight", "throttle_rate", "ordering", "signature", "filter", "header_names", "auth",
              "client_certificate", "health", "consecutive_failures", "failing_since", "tripped_at", "next_probe_at",
              "failed_probes", "deleted_at", "created_at", "updated_at")
    ops_editable = ("description", "enabled", "max_in_flight", "throttle_rate", "ordering", "filter",
                    *DESTINATION_FIELDS)
    form = EndpointAdminForm

    @admin.display(description="health")
    def health(self, endpoint: Endpoint) -> str:
        return endpoint.health_state

    # Headers, auth and the client certificate as the API shows them: never a header value, password,
    # token, client secret or private key (the tenant sets them through the API or the portal).
    @admin.display(description="extra headers")
    def header_names(self, endpoint: Endpoint) -> str:
        access = endpoint_access(endpoint=endpoint)
        return ", ".join(access.header_names) if access and access.header_names else "-"

    @admin.display(description="auth")
    def auth(self, endpoint: Endpoint) -> str:
        access = endpoint_access(endpoint=endpoint)
        if access is None or not access.auth_type:
            return "-"
        shown = ", ".join(f"{name}={value}" for name, value in access.auth_shown.items() if value)
        return f"{access.auth_type} ({shown})" if shown else access.auth_type

    @admin.display(description="client certificate")
    def client_certificate(self, endpoint: Endpoint) -> str:
        access = endpoint_access(endpoint=endpoint)
        if access is None or not access.certificate:
            return "-"
        return f"{access.certificate_subject}, expires {access.certificate_expires_at:%Y-%m-%d %H:%M} UTC"
    inlines = [EndpointSecretInline]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant", "access")

    def get_fields(self, request, obj=None):
        """A broker endpoint shows its kind's fields after its URL (shown without credentials)."""
        if obj is None or obj.kind not in BROKERS:
            return self.fields
        at = self.fields.index("url") + 1
        return self.fields[:at] + BROKERS[obj.kind].fields + self.fields[at:]

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.deleted_at is not None:
            return self.get_fields(request, obj)
        return tuple(field for field in self.fields if field not in self.ops_editable)

    def has_add_permission(self, request):
        return False  # the API creates them, so that the tenant receives the signing secret

    def has_delete_permission(self, request, obj=None):
        return False  # deleting is the API's soft delete, which also cancels pending deliveries

    def save_model(self, request, obj, form, change):
        endpoint_update(endpoint=obj, **{field: form.cleaned_data[field] for field in form.changed_data})


class DeliveryInline(_ReadOnlyMixin, admin.TabularInline):
    model = Delivery
    verbose_name_plural = "deliveries"
    fields = ("id", "endpoint", "status", "attempt_count", "next_attempt_at")
    readonly_fields = fields
    show_change_link = True
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("endpoint")


# The distinct event types, skipping through event_tenant_type (tenant, type, -id) one (tenant, type)
# pair at a time: an index probe per pair, where SELECT DISTINCT type reads every event.
_EVENT_TYPES_SQL = f"""
WITH RECURSIVE pairs(tenant_id, type, depth) AS (
    (SELECT tenant_id, type, 1 FROM {Event._meta.db_table} ORDER BY tenant_id, type LIMIT 1)
    UNION ALL
    SELECT n.tenant_id, n.type, p.depth + 1 FROM pairs p,
      LATERAL (SELECT e.tenant_id, e.type FROM {Event._meta.db_table} e
                WHERE (e.tenant_id, e.type) > (p.tenant_id, p.type)
                ORDER BY e.tenant_id, e.type LIMIT 1) n
     WHERE p.depth < %(pairs)s
)
SELECT DISTINCT type FROM pairs ORDER BY type LIMIT %(limit)s
"""


def event_types(*, limit: int = 200, pairs: int = 5000) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_EVENT_TYPES_SQL, {"limit": limit, "pairs": pairs})
        return [row[0] for row in cursor.fetchall()]


class EventTypeFilter(admin.SimpleListFilter):
    """Filter deliveries by their event's type: the deliveries of the newest CappedCountPaginator.CAP events of
    that type (the list counts no further). The choices come from the events' index, not a join.

    Not a join of deliveries with events: both are partitioned by time (webhooks/services/partitions.py), and a
    join probes every partition of events for each delivery (PostgreSQL prunes the partitions again for every row):
    234 ms on 2M deliveries over 60 days, where the events are read first here, newest first, and their
    deliveries then found in the days those events lie in (the oldest one's id bounds the days read)."""

    title = "event type"
    parameter_name = "event__type"

    def lookups(self, request, model_admin):
        return [(event_type, event_type) for event_type in event_types()]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        events = list(Event.objects.filter(type=self.value()).order_by("-id")
                      .values_list("id", flat=True)[:CappedCountPaginator.CAP])
        if not events:
            return queryset.none()
        # a delivery's id extends its event's: none of these events' deliveries sorts below the oldest event's
        return queryset.filter(event_id__in=events, id__gte="dlv_" + events[-1].removeprefix("evt_"))


class OwnTypeFilter(EventTypeFilter):
    """Events by type (the same choices)."""

    parameter_name = "type"

    def queryset(self, request, queryset):
        return queryset.filter(type=self.value()) if self.value() else queryset


@admin.register(Event)
class EventAdmin(_LeanChangeListMixin, _ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "tenant", "type", "created_at")
    # created_at: Today / Past 7 days / This month / This year, and any range as
    # ?created_at__gte=…&created_at__lt=… (an index range on the ids would be cheaper, but created_at is
    # what the API filters on); not a date_hierarchy, whose date links count over the whole table.
    list_filter = (OwnTypeFilter, ("created_at", admin.DateFieldListFilter), "tenant")
    list_select_related = ("tenant",)
    search_fields = ("id__exact",)
    search_help_text = "An exact event id (evt_…)."
    show_full_result_count = False
    changelist_defer = ("payload",)
    fields = ("id", "tenant", "type", "channels", "created_at", "request_id", "data", "payload_text")
    readonly_fields = fields
    inlines = [DeliveryInline]

    @admin.display(description="payload (the bytes every attempt sends)")
    def payload_text(self, event: Event) -> str:
        return bytes(event.payload).decode("utf-8", errors="replace")


class DeliveryAttemptInline(_ReadOnlyMixin, admin.TabularInline):
    model = DeliveryAttempt
    verbose_name_plural = "attempts"
    fields = ("number", "started_at", "duration_ms", "response_status", "error", "response_body")
    readonly_fields = fields
    ordering = ("number",)
    extra = 0


@admin.register(Delivery)
class DeliveryAdmin(_LeanChangeListMixin, _ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "event_column", "endpoint_column", "status", "attempt_count", "next_attempt_at")
    list_filter = ("status", ("created_at", admin.DateFieldListFilter), "endpoint", EventTypeFilter)
    list_select_related = ("event", "endpoint")
    search_fields = ("id__exact", "event__id__exact")
    search_help_text = "An exact delivery id (dlv_…) or event id (evt_…)."
    show_full_result_count = False
    changelist_defer = ("event__payload",)
    fields = ("id", "tenant", "event", "endpoint", "status", "retry", "attempt_count", "next_attempt_at",
              "in_flight_until", "parked_at", "created_at", "updated_at")
    readonly_fields = fields
    actions = ["retry_failed_deliveries"]
    inlines = [DeliveryAttemptInline]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant", "event", "endpoint")

    @admin.display(description="in flight until")
    def in_flight_until(self, delivery: Delivery):
        lease = DeliveryLease.objects.filter(delivery=delivery).first()
        return lease.until if lease else "-"

    def get_fields(self, request, obj=None):
        if obj is not None and obj.status == Delivery.FAILED and self.has_retry_permission(request):
            return self.fields
        return tuple(field for field in self.fields if field != "retry")

    @admin.display(description="event", ordering="event_id")
    def event_column(self, delivery: Delivery) -> str:
        return format_html('<a href="{}">{}</a><br><small>{}</small>',
                           reverse("admin:webhooks_event_change", args=[quote(delivery.event_id)]),
                           delivery.event_id, delivery.event.type)

    @admin.display(description="endpoint", ordering="endpoint_id")
    def endpoint_column(self, delivery: Delivery) -> str:
        return format_html('<a href="{}" title="{}">{}</a>',
                           reverse("admin:webhooks_endpoint_change", args=[quote(delivery.endpoint_id)]),
                           delivery.endpoint_id, Truncator(delivery.endpoint.url).chars(60))

    def has_retry_permission(self, request) -> bool:
        """Retrying is a write: it needs the change permission even though the page is read-only."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    @admin.display(description="retry")
    def retry(self, delivery: Delivery) -> str:
        # A submit button of the page's own form (which carries the CSRF token), posted to retry_view.
        return format_html(
            '<button type="submit" class="button" formaction="{}" formmethod="post">Retry now</button>',
            reverse("admin:webhooks_delivery_retry", args=[quote(delivery.pk)]))

    def get_urls(self):
        retry = path("<path:object_id>/retry/", self.admin_site.admin_view(self.retry_view),
                     name="webhooks_delivery_retry")
        return [retry, *super().get_urls()]

    def retry_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_retry_permission(request):
            raise PermissionDenied
        delivery = get_object_or_404(self.get_queryset(request), pk=unquote(object_id))
        self._retry(request, [delivery])
        return HttpResponseRedirect(reverse("admin:webhooks_delivery_change", args=[quote(delivery.pk)]))

    @admin.action(description="Retry selected failed deliveries", permissions=["retry"])
    def retry_failed_deliveries(self, request, queryset):
        self._retry(request, queryset)

    @staticmethod
    def _retried(delivery: Delivery) -> bool:
        try:
            return retries.delivery_retry(delivery=delivery).status == Delivery.PENDING
        except Delivery.DoesNotExist:  # deleted by retention meanwhile: counted as skipped
            return False

    def _retry(self, request, deliveries) -> None:
        selected = list(deliveries)
        retried = sum(self._retried(delivery) for delivery in selected if delivery.status == Delivery.FAILED)
        skipped = len(selected) - retried
        if retried:
            level = messages.SUCCESS
            text = ngettext("Retried %(count)d failed delivery; it is being sent now.",
                            "Retried %(count)d failed deliveries; they are being sent now.",
                            retried) % {"count": retried}
        else:
            level, text = messages.WARNING, "Nothing retried: only a failed delivery can be retried."
        if skipped:
            text += " " + ngettext("Skipped %(count)d that was not failed.",
                                   "Skipped %(count)d that were not failed.", skipped) % {"count": skipped}
        self.message_user(request, text, level)


class EventTypeAdminForm(forms.ModelForm):
    """Checked as the API checks (webhooks/services/event_catalog.py): a schema error or an example that does
    not match shows on its field, with the JSON pointer it is at."""

    class Meta:
        model = EventType
        fields = ("name", "description", "schema", "example")

    def clean(self):
        cleaned = super().clean()
        if "name" in self.fields and cleaned.get("name"):
            for message in event_catalog.event_type_name_errors(cleaned["name"]):
                self.add_error("name", message)
        if "schema" in cleaned and "example" in cleaned:
            try:
                event_catalog.event_type_check(schema=cleaned["schema"], example=cleaned["example"])
            except event_catalog.EventTypeInvalid as exc:
                for pointer, messages_ in exc.errors.items():
                    field = "example" if pointer.startswith("/example") else "schema"
                    for message in messages_:
                        self.add_error(field, f"{pointer}: {message}")
        return cleaned


@admin.register(EventType)
class EventTypeAdmin(admin.ModelAdmin):
    """The event-type catalog the tenants read (API, portal). Writes go through the catalog's services, as
    the platform credential's do; the name is fixed once created (endpoints subscribe by it)."""

    form = EventTypeAdminForm
    list_display = ("name", "description", "has_schema", "updated_at")
    search_fields = ("name", "description")
    fields = ("id", "name", "description", "schema", "example", "created_at", "updated_at")

    @admin.display(boolean=True, description="schema")
    def has_schema(self, event_type: EventType) -> bool:
        return event_type.schema_digest is not None

    def get_readonly_fields(self, request, obj=None):
        return ("id", "created_at", "updated_at") + (("name",) if obj is not None else ())

    def save_model(self, request, obj, form, change):
        fields = {name: form.cleaned_data[name] for name in ("description", "schema", "example")}
        if change:
            event_catalog.event_type_update(event_type=obj, **fields)
            return
        created = event_catalog.event_type_create(name=form.cleaned_data["name"], **fields)
        obj.__dict__.update({key: value for key, value in created.__dict__.items() if key != "_state"})
        obj._state.adding = False

    def delete_model(self, request, obj):
        event_catalog.event_type_delete(event_type=obj)


@admin.register(Recovery)
class RecoveryAdmin(_ReadOnlyMixin, admin.ModelAdmin):
    """Recoveries of endpoints' failed deliveries (SPEC §11): made through the API or the portal, looked at here."""

    list_display = ("id", "tenant", "endpoint", "since", "until", "status", "done", "total", "created_at",
                    "completed_at")
    list_filter = ("status", ("created_at", admin.DateFieldListFilter))
    list_select_related = ("tenant", "endpoint")
    search_fields = ("id__exact", "endpoint__id__exact")
    search_help_text = "An exact recovery id (rcv_…) or endpoint id (ep_…)."
    fields = ("id", "tenant", "endpoint", "since", "until", "status", "total", "done", "created_at", "updated_at",
              "completed_at")
    readonly_fields = fields
