"""Traces (SPEC §12): real gunicorn and Celery processes export to a local OTLP/HTTP receiver; one trace runs
from the caller's span through the intake to every attempt of the event's deliveries, and on to the receiver."""
import json
import re
import secrets
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import requests
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.access_servers import TokenServer
from tests.conftest import create_endpoint, subprocess_env, wait_until
from tests.otlp import OtlpReceiver
from tests.processes import ROOT, celery_beat, celery_worker, free_port, gunicorn, run_dir
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryAttempt, Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def otlp():
    server = OtlpReceiver()
    yield server
    server.close()


def _context_of(traceparent: str):
    """(trace id, span id) a traceparent header names, read by OpenTelemetry's W3C propagator."""
    context = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": traceparent}))
    span_context = context.get_span_context()
    assert span_context.is_valid, traceparent
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


@pytest.mark.slow
def test_one_trace_runs_from_the_callers_span_to_every_attempt_and_on_to_the_receiver(api, receiver, otlp, processes):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    server = processes(gunicorn(free_port(), workers=1, **env))
    processes(celery_worker("tracing", concurrency=4, **env))
    ok = create_endpoint(api, receiver.url("/ok"))
    flaky = create_endpoint(api, receiver.url("/flaky"))
    receiver.script("/flaky", Answer(status=503, body=b"busy"))  # then 200: a retry one second later

    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    response = requests.post(f"{server.url}/api/v1/events", json={"type": "invoice.paid", "data": {"n": 1}},
                             timeout=20, headers={"Authorization": f"Bearer {api.token}",
                                                  "Idempotency-Key": "trace-0001",
                                                  "traceparent": f"00-{caller_trace}-{caller_span}-01"})
    assert response.status_code == 202, response.content
    event_id = response.json()["id"]
    delivery_ids = [d["id"] for d in response.json()["deliveries"]]
    wait_until(lambda: Delivery.objects.filter(pk__in=delivery_ids, status=Delivery.SUCCEEDED).count() == 2)
    assert _context_of(Event.objects.get(pk=event_id).traceparent)[0] == caller_trace  # stored with the event

    def complete(spans):
        ours = [s for s in spans if s.trace_id == caller_trace]
        return (sum(s.name == "herald.record" for s in ours) == 3
                and sum(s.name == "herald.delivery" for s in ours) == 3
                and any(s.name == "herald.outbox.publish" for s in spans))

    spans = otlp.wait_for(complete)
    ours = [s for s in spans if s.trace_id == caller_trace]
    by_id = {s.span_id: s for s in ours}
    _save(ours, spans)

    # The caller's span is the parent of Herald's root, the intake request (Django's own instrumentation).
    roots = [s for s in ours if s.parent_span_id not in by_id]
    assert [(r.kind, r.service, r.parent_span_id) for r in roots] == [("SERVER", "herald-web", caller_span)]
    request_span = roots[0]
    assert request_span.attributes["http.response.status_code"] == 202
    transaction_span, = [s for s in ours if s.name == "herald.intake.transaction"]
    assert transaction_span.parent_span_id == request_span.span_id
    # psycopg's instrumentation: the statements of the intake's transaction, inside it
    assert any(s.attributes.get("db.system") == "postgresql" and s.parent_span_id == transaction_span.span_id
               for s in ours)
    # the doorbell rung after the commit (redis' instrumentation under our span, on the publisher's thread)
    ring, = [s for s in ours if s.name == "herald.outbox.ring"]
    assert ring.parent_span_id == transaction_span.span_id
    assert any(s.parent_span_id == ring.span_id and s.attributes.get("db.system") == "redis" for s in ours)

    # One trace across processes: the worker's spans are in it.
    assert {s.service for s in ours} == {"herald-web", "herald-worker"}
    deliveries = [s for s in ours if s.name == "herald.delivery"]
    assert all(d.parent_span_id == transaction_span.span_id and d.service == "herald-worker" for d in deliveries)
    delivery_to = dict(Delivery.objects.filter(pk__in=delivery_ids).values_list("endpoint_id", "id"))
    assert sorted((d.attributes["herald.delivery_id"], d.attributes["herald.attempt"]) for d in deliveries) == sorted(
        [(delivery_to[ok["id"]], 1), (delivery_to[flaky["id"]], 1), (delivery_to[flaky["id"]], 2)])
    for delivery in deliveries:
        children = sorted((s for s in ours if s.parent_span_id == delivery.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in children] == ["herald.claim", "POST", "herald.record"]
        assert delivery.attributes["herald.status"] in ("succeeded", "pending")

    # Each attempt: a CLIENT span with its status, duration, endpoint, attempt number and error.
    attempts = [s for s in ours if s.kind == "CLIENT" and s.name == "POST"]
    endpoint_of = {ok["id"]: "/ok", flaky["id"]: "/flaky"}
    assert sorted((endpoint_of[a.attributes["herald.endpoint_id"]], a.attributes["herald.attempt"],
                   a.attributes["http.response.status_code"], a.status_code) for a in attempts) == [
        ("/flaky", 1, 503, 2), ("/flaky", 2, 200, 0), ("/ok", 1, 200, 0)]  # status 2: ERROR
    for attempt in attempts:
        assert attempt.attributes["http.request.method"] == "POST"
        assert attempt.attributes["url.full"] == receiver.url(endpoint_of[attempt.attributes["herald.endpoint_id"]])
        assert attempt.attributes["herald.delivery_id"] in delivery_ids
        assert 0 <= attempt.attributes["herald.duration_ms"] < 2000
    failed, = [a for a in attempts if a.status_code == 2]
    assert failed.attributes["error.type"] == "503" and failed.status_message == "HTTP 503"

    # The receiver got a traceparent of that trace: the attempt's own CLIENT span is its parent.
    sent = [_context_of(r.headers["traceparent"]) for r in receiver.received]
    assert sorted(sent) == sorted((caller_trace, a.span_id) for a in attempts)

    # Batching: the relay's message carried ids of this event among others; its span links to our trace,
    # and each delivery's span links to the Celery task that brought it (when one did) and to its claim batch.
    publishes = [s for s in spans if s.name == "herald.outbox.publish" and s.service == "herald-worker"]
    assert any((caller_trace, transaction_span.span_id, {}) in p.links for p in publishes)
    runs = {s.span_id: s for s in spans if s.name.startswith("run/") and "deliver_many" in s.name}
    first = [d for d in deliveries if d.attributes["herald.attempt"] == 1]
    assert all(any(link[1] in runs for link in d.links) for d in first)
    claim_batches = {s.span_id for s in spans if s.name == "herald.claim.batch"}
    assert all(any(link[1] in claim_batches for link in d.links) for d in deliveries)


@pytest.mark.slow
def test_gunicorn_without_preload_and_a_solo_worker_trace_too(api, receiver, otlp, processes):
    """gunicorn as gunicorn.conf.py starts it (post_fork sets each worker up before it loads the app) and a
    solo worker (no engine or relay: beat's dispatcher publishes, and the task claims, sends and records
    on its own thread: `delivery_attempt`)."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    server = processes(gunicorn(free_port(), workers=None, threads=None, **env))
    processes(celery_worker("tracing-solo", concurrency=None, pool="solo", **env))
    processes(celery_beat(**env))
    endpoint = create_endpoint(api, receiver.url("/hook"))
    dead = create_endpoint(api, f"http://127.0.0.1:{free_port()}/dead")  # nothing listens: connection refused
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    response = requests.post(f"{server.url}/api/v1/events", json={"type": "invoice.paid", "data": {}}, timeout=20,
                             headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": "trace-solo-1",
                                      "traceparent": f"00-{caller_trace}-{caller_span}-01"})
    assert response.status_code == 202, response.content
    got, = receiver.wait_for(1, "/hook")

    def complete(spans):
        return {s.attributes.get("herald.endpoint_id") for s in spans
                if s.trace_id == caller_trace and s.name == "herald.delivery"} >= {endpoint["id"], dead["id"]}

    ours = [s for s in otlp.wait_for(complete) if s.trace_id == caller_trace]
    request_span, = [s for s in ours if s.kind == "SERVER"]
    assert request_span.parent_span_id == caller_span and request_span.service == "herald-web"
    attempts = [s for s in ours if s.kind == "CLIENT" and s.name == "POST"]
    refused = [s for s in attempts if s.attributes["herald.endpoint_id"] == dead["id"]]
    assert refused and all(s.status_code == 2 and s.attributes["error.type"] == "connection_error"
                           and "Connection refused" in s.attributes["herald.error"]
                           and "http.response.status_code" not in s.attributes for s in refused)
    attempt, = [s for s in attempts if s.attributes["herald.endpoint_id"] == endpoint["id"]]
    assert attempt.service == "herald-worker"
    assert attempt.attributes["http.response.status_code"] == 200 and attempt.attributes["herald.attempt"] == 1
    assert _context_of(got.headers["traceparent"]) == (caller_trace, attempt.span_id)


@pytest.mark.slow
def test_attempts_prepared_off_the_engine_thread_are_traced_like_the_others(api, receiver, otlp, processes):
    """An OAuth2 client-credentials endpoint: the engine prepares its attempt on a thread of its pool (the token
    fetch), then sends it. Its spans are those of any attempt: `herald.delivery` under the event's stored
    traceparent, a CLIENT `POST` with status and attributes whose traceparent the receiver gets; a token
    endpoint that refuses is a failed attempt span (`oauth2_token`) that never sent. No secret in any span."""
    tokens = TokenServer()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        server = processes(gunicorn(free_port(), workers=1, **env))
        processes(celery_worker("tracing-oauth2", concurrency=4, **env))
        oauth2 = {"type": "oauth2_client_credentials", "token_url": tokens.url, "client_id": tokens.client_id}
        good = create_endpoint(api, receiver.url("/oauth2"), auth={**oauth2, "client_secret": tokens.client_secret})
        refused = create_endpoint(api, receiver.url("/refused"), auth={**oauth2, "client_secret": "not-the-secret"})
        caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
        response = requests.post(f"{server.url}/api/v1/events", json={"type": "invoice.paid", "data": {"n": 1}},
                                 timeout=20, headers={"Authorization": f"Bearer {api.token}",
                                                      "Idempotency-Key": "trace-oauth2-1",
                                                      "traceparent": f"00-{caller_trace}-{caller_span}-01"})
        assert response.status_code == 202, response.content
        delivery_of = {Delivery.objects.get(pk=d["id"]).endpoint_id: d["id"] for d in response.json()["deliveries"]}
        got, = receiver.wait_for(1, "/oauth2")
        wait_until(lambda: DeliveryAttempt.objects.filter(delivery_id=delivery_of[refused["id"]]).exists())
        assert len(tokens.requests) == 2  # one per endpoint, on the engine's preparing threads

        def complete(spans):
            return sum(s.trace_id == caller_trace and s.name == "herald.delivery" for s in spans) == 2
        ours = [s for s in otlp.wait_for(complete) if s.trace_id == caller_trace]
    finally:
        tokens.close()
    # the event's stored traceparent (the intake's transaction span) is each delivery's parent
    event_trace, event_span = _context_of(Event.objects.get(pk=response.json()["id"]).traceparent)
    assert event_trace == caller_trace
    deliveries = {s.attributes["herald.endpoint_id"]: s for s in ours if s.name == "herald.delivery"}
    assert set(deliveries) == {good["id"], refused["id"]}
    for endpoint_id, delivery in deliveries.items():
        assert delivery.parent_span_id == event_span and delivery.service == "herald-worker"
        assert delivery.attributes["herald.delivery_id"] == delivery_of[endpoint_id]
        assert delivery.attributes["herald.attempt"] == 1 and delivery.attributes["herald.status"] == (
            "succeeded" if endpoint_id == good["id"] else "pending")
        children = sorted((s for s in ours if s.parent_span_id == delivery.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in children] == ["herald.claim", "POST", "herald.record"]

    attempts = {s.attributes["herald.endpoint_id"]: s for s in ours if s.kind == "CLIENT" and s.name == "POST"}
    sent, failed = attempts[good["id"]], attempts[refused["id"]]
    for endpoint_id, attempt in attempts.items():
        assert attempt.parent_span_id == deliveries[endpoint_id].span_id
        assert attempt.attributes["http.request.method"] == "POST" and attempt.attributes["herald.attempt"] == 1
        assert attempt.attributes["herald.delivery_id"] == delivery_of[endpoint_id]
        assert attempt.end_ns >= attempt.start_ns and 0 <= attempt.attributes["herald.duration_ms"] < 5000
    assert sent.attributes["url.full"] == receiver.url("/oauth2")
    assert sent.attributes["http.response.status_code"] == 200 and sent.status_code == 0
    # the token the good endpoint was given (the two endpoints' fetches run at once, in either order)
    issued, = [f"tok-{n}" for n, request in enumerate(tokens.requests, 1)
               if request.client == (tokens.client_id, tokens.client_secret)]
    assert got.headers["authorization"] == f"Bearer {issued}"
    assert _context_of(got.headers["traceparent"]) == (caller_trace, sent.span_id)
    assert failed.status_code == 2 and failed.attributes["error.type"] == "oauth2_token"
    assert failed.attributes["herald.error"].startswith("oauth2_token:") and "invalid_client" in failed.status_message
    assert "http.response.status_code" not in failed.attributes
    assert receiver.requests_to("/refused") == []
    exported = json.dumps([s.as_dict() for s in ours])
    assert tokens.client_secret not in exported and issued not in exported


def _save(ours, spans) -> None:
    """The captured trace, for docs/tracing.png (scripts/render-trace draws it)."""
    out = run_dir("trace") / "trace.json"
    out.write_text(json.dumps({"trace": [s.as_dict() for s in ours],
                               "other": [s.as_dict() for s in spans if s not in ours]}, indent=1))
    (ROOT / "tests" / "artifacts" / "last-trace.json").write_text(out.read_text())


_PROBE = """
import json, sys
import config.wsgi
from config.celery import _start_tracing, _start_tracing_in_child
from django.conf import settings
from webhooks import tracing
_start_tracing()
_start_tracing_in_child()
from opentelemetry import trace
# redis-py imports OpenTelemetry's metrics SDK for its own (off) observability: not ours to judge here
ours = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.instrumentation")
print(json.dumps({"enabled": tracing.ENABLED, "sdk": sorted(m for m in sys.modules if m.startswith(ours)),
                  "provider": type(trace.get_tracer_provider()).__name__,
                  "middleware": [m for m in settings.MIDDLEWARE if "opentelemetry" in m]}))
"""


@pytest.mark.slow
def test_a_portal_links_token_is_masked_in_every_exported_span(api, otlp, processes):
    """The link is opened (GET, while it still works), redeemed (POST) and asked for with a wrong method;
    the request spans name the path, and what the collector decodes holds `/portal/open/***`, never the token."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    server = processes(gunicorn(free_port(), workers=1, threads=2, **env))
    link = api.post("portal-links")
    assert link.status_code == 201, link.content
    path = urlsplit(link.json()["url"]).path
    token = path.rsplit("/", 1)[1]
    browser = requests.Session()
    page = browser.get(server.url + path, timeout=20)
    assert page.status_code == 200
    assert browser.options(server.url + path, timeout=20).status_code == 405
    (csrf,) = set(re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text))
    opened = browser.post(server.url + path, data={"csrfmiddlewaretoken": csrf}, allow_redirects=False,
                          headers={"Origin": server.url, "Referer": server.url + path}, timeout=20)
    assert opened.status_code == 302, opened.text[:300]

    def served(spans):
        return sum(s.kind == "SERVER" and "/portal/open/" in json.dumps(s.attributes) for s in spans) >= 3

    spans = otlp.wait_for(served)
    requests_spans = [s for s in spans if s.kind == "SERVER" and "/portal/open/" in json.dumps(s.attributes)]
    assert {s.attributes.get("http.request.method") for s in requests_spans} == {"GET", "POST", "OPTIONS"}
    assert all("/portal/open/***" in json.dumps(s.attributes) for s in requests_spans)
    assert not [s for s in spans if token in json.dumps(s.as_dict())]


@pytest.mark.parametrize("endpoint", ["", "http://127.0.0.1:9"])
def test_without_the_variable_no_provider_exporter_or_instrumentation_is_installed(endpoint):
    """The web process's start (config/wsgi.py) and the worker's (both Celery signals) as they run, in a
    process of their own; with the variable set the same start installs them (the test can tell)."""
    env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    probe = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    if endpoint:
        assert seen["enabled"] and seen["provider"] == "TracerProvider" and seen["sdk"]
        assert seen["middleware"] == [
            "opentelemetry.instrumentation.django.middleware.otel_middleware._DjangoMiddleware"]
    else:
        assert seen == {"enabled": False, "sdk": [], "provider": "ProxyTracerProvider", "middleware": []}
