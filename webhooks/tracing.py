"""Traces (SPEC §12): one trace from `POST /events` to every attempt of its deliveries, across processes.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT is set (config/settings.py). Off, nothing of OpenTelemetry's SDK
is imported, no provider or exporter exists, and the hot paths pay one check of `ENABLED`.

On, each process calls `setup()` once (gunicorn's post_fork and config/wsgi.py; Celery's worker_init,
or worker_process_init in a prefork child): an SDK tracer provider exporting over OTLP/HTTP from a
batch processor, and OpenTelemetry's own instrumentation of Django (the request's SERVER span, whose
parent is the caller's `traceparent`), Celery (publish and run spans, context in the message headers),
psycopg (a span per statement) and redis (the doorbell). Herald's own spans fill the rest:

- `herald.intake.transaction`: the intake's one transaction (intake/idempotency/middleware.py). The
  event it records stores the W3C traceparent of that span (`Event.traceparent`), so the context
  travels with the rows, not with a message: a relay that puts 100 ids of 100 events in one message,
  a retry hours later or a delivery recovered by beat's dispatcher all find their trace again.
- `herald.outbox.publish`: a relay (or the dispatcher) sending one `deliver_many` message, with a
  link to the trace of each event whose delivery it carries.
- per delivery, in its event's trace: `herald.delivery` (linked to the Celery task that brought it),
  with children `herald.claim`, the attempt's CLIENT span `POST` (status, duration, endpoint id,
  attempt number, error) and `herald.record`. The attempt sends the receiver a `traceparent` of that
  CLIENT span. A worker claims and records many deliveries in one statement: those statements run in
  batch spans (`herald.claim.batch`, `herald.record.batch`, each with its psycopg span) that the
  per-delivery spans link to.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from webhooks.conf import herald_settings


# What a delivery's trace reads of its claim and of an attempt's result (webhooks/delivery/claim.py's Claim,
# webhooks/delivery/destinations/base.py's AttemptResult): described here, so that tracing, which the delivery
# package uses, imports nothing of it, not even for its types.
class Claim(Protocol):
    delivery_id: str
    event_id: str
    event_type: str
    endpoint_id: str
    tenant_id: str
    number: int
    probe: bool
    url: str


class AttemptResult(Protocol):
    status: int | None
    duration_ms: int
    error: str

    @property
    def ok(self) -> bool: ...

logger = logging.getLogger("herald.tracing")

# True in a process that exports traces (set by setup()); everything below is a no-op otherwise.
ENABLED = False
_setup_pid: int | None = None
_NOTHING = contextlib.nullcontext()


def setup(process: str) -> bool:
    """Start tracing in this process (`web` or `worker`) if OTEL_EXPORTER_OTLP_ENDPOINT is set; once per
    process (a forked child sets up its own). True if this process exports traces."""
    global ENABLED, _setup_pid
    if not herald_settings.tracing.enabled:  # another settings module (bench's floors) has none
        return False
    if _setup_pid is not None:
        # Set up before a fork (gunicorn --preload, a prefork parent): the provider carries on in the
        # child, whose batch processor the SDK restarts; a second provider could not replace it anyway.
        _setup_pid = os.getpid()
        return True
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # The instrumentations read it from the environment when they start (see config/settings.py).
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = herald_settings.tracing.OTEL_SEMCONV_STABILITY_OPT_IN
    # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME are read by Resource.create; ours only name the
    # process when the operator did not.
    attributes = {"herald.process": process, "service.version": herald_settings.delivery.version}
    if not herald_settings.tracing.OTEL_SERVICE_NAME:
        attributes["service.name"] = f"herald-{process}"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(_masking(OTLPSpanExporter())))
    trace.set_tracer_provider(provider)
    # The instrumentors patch libraries once per interpreter (a forked child inherits the patches).
    for instrumentor, options in (
            (DjangoInstrumentor(), {"excluded_urls": herald_settings.tracing.OTEL_PYTHON_DJANGO_EXCLUDED_URLS}),
            (CeleryInstrumentor(), {}), (PsycopgInstrumentor(), {}), (RedisInstrumentor(), {})):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(**options)
    _setup_pid = os.getpid()
    ENABLED = True
    logger.info("tracing.started", extra={"herald_process": process})
    return True


def _masking(exporter):
    """`exporter`, with a portal link's token masked in every span it exports (webhooks/urltext.py): the
    request's SERVER span carries the path (`url.path`, `http.target`, its name when no route matched) while
    the link still works. At the exporter, the one place every span of every instrumentation passes."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Status

    from webhooks.urltext import mask_secrets

    def value(item):
        if isinstance(item, str):
            return mask_secrets(item)
        if isinstance(item, (tuple, list)):
            return type(item)(value(element) for element in item)
        return item

    def attributes(mapping):
        return {key: value(item) for key, item in mapping.items()} if mapping else mapping

    def masked(span: ReadableSpan) -> ReadableSpan:
        seen = [span.name, span.status.description or ""]
        seen += [item for item in (span.attributes or {}).values() if isinstance(item, (str, tuple, list))]
        seen += [item for event in span.events for item in (event.attributes or {}).values()]
        if not any("/portal/open/" in str(item) for item in seen):
            return span  # the common case: the span as it is
        return ReadableSpan(
            name=mask_secrets(span.name), context=span.context, parent=span.parent, resource=span.resource,
            attributes=attributes(span.attributes),
            events=[Event(event.name, attributes(event.attributes), event.timestamp) for event in span.events],
            links=span.links, kind=span.kind, status=Status(span.status.status_code, value(span.status.description)),
            start_time=span.start_time, end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)

    class MaskingExporter(SpanExporter):
        def export(self, spans):
            return exporter.export([masked(span) for span in spans])

        def shutdown(self):
            return exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000):
            return exporter.force_flush(timeout_millis)

    return MaskingExporter()


_herald_tracer = None


def _tracer():
    global _herald_tracer
    if _herald_tracer is None:  # one per process: the provider makes a new one on every call
        from opentelemetry import trace

        _herald_tracer = trace.get_tracer("herald", herald_settings.delivery.version)
    return _herald_tracer


def span(name: str, **attributes: Any):
    """A context manager: an INTERNAL span of the current trace when tracing is on, else nothing."""
    if not ENABLED:
        return _NOTHING
    return _tracer().start_as_current_span(name, attributes=attributes or None)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span (None outside any trace)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def _span_context(traceparent: str | None):
    """The span context a stored traceparent names (invalid if it names none)."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent:
        return trace.INVALID_SPAN_CONTEXT
    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent}, context=Context())
    return trace.get_current_span(context).get_span_context()


def current_context():
    """The current OpenTelemetry context (to carry to another thread), or None when tracing is off."""
    if not ENABLED:
        return None
    from opentelemetry import context

    return context.get_current()


@contextlib.contextmanager
def attached(context):
    """Run the block in `context` (one from `current_context()`; None: as it is)."""
    if context is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def suppressed():
    """A context manager in which OpenTelemetry's instrumentations make no spans (a relay's idle polls)."""
    if not ENABLED:
        return _NOTHING
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    return suppress_instrumentation()


def current_span_context():
    """The current span's context (to link to later), or None when tracing is off or there is none."""
    if not ENABLED:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def event_traceparents(*, event_ids: Iterable[str] = (), delivery_ids: Iterable[str] = ()) -> dict[str, str]:
    """Stored traceparents by event id (`event_ids`) or by delivery id (`delivery_ids`); one query, made
    only while tracing is on. Events recorded with tracing off have none."""
    from django.db import connection

    from webhooks.models import Delivery, Event

    if event_ids:
        sql = f"SELECT id, traceparent FROM {Event._meta.db_table} WHERE id = ANY(%s) AND traceparent IS NOT NULL"
        keys = list(dict.fromkeys(event_ids))
    else:
        sql = (f"SELECT d.id, e.traceparent FROM {Delivery._meta.db_table} d JOIN {Event._meta.db_table} e"
               f" ON e.id = d.event_id WHERE d.id = ANY(%s) AND e.traceparent IS NOT NULL")
        keys = list(delivery_ids)
    if not keys:
        return {}
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, [keys])
            return dict(cursor.fetchall())
    except Exception as exc:  # noqa: BLE001 - tracing never stops a delivery: these spans start traces of their own
        logger.warning("tracing.context_unavailable", extra={"error": repr(exc)})
        return {}


def publish_span(traceparents: Iterable[str], **attributes: Any):
    """`herald.outbox.publish` around one message's publication, linked to each event trace it carries."""
    from opentelemetry import trace
    from opentelemetry.trace import Link

    links = [Link(context) for context in (_span_context(tp) for tp in dict.fromkeys(traceparents))
             if context.is_valid]
    return _tracer().start_as_current_span("herald.outbox.publish", kind=trace.SpanKind.PRODUCER, links=links,
                                           attributes=attributes or None)


def batch(name: str, size: int):
    """A `Batch` when tracing is on (`with … as b`: b is None when off)."""
    return Batch(name, size) if ENABLED else _NOTHING


class Batch:
    """A claim or record statement run for many deliveries at once (`herald.claim.batch`,
    `herald.record.batch`): its span holds that statement's psycopg span, its times are every
    delivery's claim or record times, and each delivery's own span links to it."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self.start_ns = self.end_ns = time.time_ns()

    def __enter__(self) -> Batch:
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        self.origin = context if context.is_valid else None  # the span it ran in (a Celery task's, on one thread)
        self._cm = _tracer().start_as_current_span(self.name, attributes={"herald.deliveries": self.size})
        self.span = self._cm.__enter__()
        self.context = self.span.get_span_context()
        self.start_ns = time.time_ns()
        return self

    def __exit__(self, *exc) -> None:
        self.end_ns = time.time_ns()
        self._cm.__exit__(*exc)


def _public_url(url: str) -> tuple[str, str | None, int | None]:
    """(url.full without user info, query or fragment, host, port): a query may carry a receiver's token."""
    from webhooks.urltext import url_without_secrets

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "", None, None
    return url_without_secrets(url), host, port


class DeliveryTrace:
    """The spans of one delivery's attempt in its event's trace (see the module doc)."""

    def __init__(self, claim: Claim, traceparent: str | None, claim_batch: Batch, origin=None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Link

        tracer = _tracer()
        parent = _span_context(traceparent)
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent.is_valid else None
        if context is None:
            from opentelemetry.context import Context

            context = Context()  # an event recorded untraced: the attempt starts a trace of its own
        links = [Link(claim_batch.context)]
        if origin is not None:
            links.append(Link(origin, {"herald.link": "celery.task"}))
        self.claim = claim
        self.span = tracer.start_span("herald.delivery", context=context, start_time=claim_batch.start_ns,
                                      links=links, attributes={
                                          "herald.delivery_id": claim.delivery_id, "herald.event_id": claim.event_id,
                                          "herald.event_type": claim.event_type,
                                          "herald.endpoint_id": claim.endpoint_id, "herald.tenant_id": claim.tenant_id,
                                          "herald.attempt": claim.number, "herald.probe": claim.probe})
        self._context = trace.set_span_in_context(self.span)
        tracer.start_span("herald.claim", context=self._context, start_time=claim_batch.start_ns,
                          links=[Link(claim_batch.context)],
                          attributes={"herald.deliveries": claim_batch.size}).end(end_time=claim_batch.end_ns)
        self.attempt = None

    def attempt_started(self, headers: dict[str, str]) -> None:
        """Start the attempt's CLIENT span and add its `traceparent` to the attempt's headers."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        url, host, port = _public_url(self.claim.url)
        self.attempt = _tracer().start_span("POST", context=self._context, kind=trace.SpanKind.CLIENT, attributes={
            "http.request.method": "POST", "url.full": url, "server.address": host or "", "server.port": port or 0,
            "herald.delivery_id": self.claim.delivery_id, "herald.endpoint_id": self.claim.endpoint_id,
            "herald.attempt": self.claim.number})
        carrier: dict[str, str] = {}
        # The W3C traceparent only: no baggage or tracestate of the caller goes on to a tenant's receiver.
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(self.attempt))
        if "traceparent" in carrier:
            headers["traceparent"] = carrier["traceparent"]

    def attempt_finished(self, result: AttemptResult) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.attempt
        if span is None:  # never sent (libcurl refused the URL): a zero-length attempt
            self.attempt_started({})
            span = self.attempt
        span.set_attribute("herald.duration_ms", result.duration_ms)
        if result.status is not None:
            span.set_attribute("http.response.status_code", result.status)
        if result.error:
            span.set_attribute("error.type", result.error.split(":", 1)[0])
            span.set_attribute("herald.error", result.error)
        elif not result.ok:
            span.set_attribute("error.type", str(result.status))
        if not result.ok:
            span.set_status(Status(StatusCode.ERROR, result.error or f"HTTP {result.status}"))
        span.end()

    def recorded(self, status: str | None, batch: Batch) -> None:
        from opentelemetry.trace import Link

        _tracer().start_span("herald.record", context=self._context, start_time=batch.start_ns,
                             links=[Link(batch.context)],
                             attributes={"herald.deliveries": batch.size, "herald.status": status or "unrecorded"}
                             ).end(end_time=batch.end_ns)
        self.span.set_attribute("herald.status", status or "unrecorded")
        self.span.end(end_time=max(batch.end_ns, time.time_ns()))


def delivery_traces(claims: Mapping[str, Claim], claim_batch: Batch, origins: Mapping[str, Any]
                    ) -> dict[str, DeliveryTrace]:
    """A DeliveryTrace for each claim, in its event's trace (one query for the stored traceparents), made
    inside `claim_batch` just after its claim."""
    claim_batch.end_ns = time.time_ns()  # the claim is done; the query below is tracing's own cost
    if not claims:
        return {}
    traceparents = event_traceparents(event_ids=[claim.event_id for claim in claims.values()])
    return {delivery_id: DeliveryTrace(claim, traceparents.get(claim.event_id), claim_batch,
                                       origins.get(delivery_id))
            for delivery_id, claim in claims.items()}
