"""POST /api/v1/events's fast path (intake/idempotency/fast_events.py, webhooks/sql/event_intake.sql) against the general
path (INTAKE_FAST_PATH off): the same requests through both — good ones, bad ones, replays, mismatches, an
expired key, a credential revoked behind the cache's back, schemas that change, concurrent duplicates —
get the same status, headers and body (ids, times and request ids aside, which differ by nature), and leave
the same rows. The good ones took the fast path: one statement."""
import io
import json
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection

from config.api_handler import Application
from intake.credentials import credential_create_platform
from intake.models import ApiCredential, IdempotencyKey
from tests.conftest import create_endpoint, make_api
from tests.processes import free_port, gunicorn
from webhooks import event_schemas
from webhooks.models import Delivery, DeliveryOutbox, Event, EventType, Tenant
from webhooks.services.event_catalog import event_type_create, event_type_delete, event_type_update

pytestmark = pytest.mark.django_db(transaction=True)

_VARYING = [(re.compile(rb"evt_[0-9A-Z]{26}"), b"evt_*"), (re.compile(rb"dlv_[0-9A-Z]{26}"), b"dlv_*"),
            (re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), b"<time>"),
            (re.compile(rb"req_[0-9a-f]{32}"), b"req_*")]


def _normal(raw: bytes) -> bytes:
    for pattern, replacement in _VARYING:
        raw = pattern.sub(replacement, raw)
    return raw


def _call(app, path: str, body: bytes, headers: dict, *, content_type="application/json", query=""):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": query,
               "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body), "wsgi.errors": io.StringIO(),
               "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": content_type}
    environ.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()})
    seen = {}

    def start_response(status, response_headers, exc_info=None):
        seen["status"], seen["headers"] = int(status.split()[0]), response_headers

    content = b"".join(app(environ, start_response))
    return seen["status"], [(name, _normal(value.encode()).decode()) for name, value in seen["headers"]], content


class Statements:
    """The statements a request sent (to tell which path answered)."""

    def __init__(self):
        self.sent: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        self.sent.append(sql)
        return execute(sql, params, many, context)


def _through(app, settings, fast: bool, requests_: list[dict], token: str, key_prefix: str):
    """Send the requests in order; (status, headers, normalised body, statements) of each."""
    settings.INTAKE_FAST_PATH = fast
    answers = []
    for request in requests_:
        headers = {"Authorization": f"Bearer {request.get('token', token)}", **request.get("headers", {})}
        if request.get("key") is not None:
            headers["Idempotency-Key"] = key_prefix + request["key"]
        body = request["body"] if isinstance(request["body"], bytes) else json.dumps(request["body"]).encode()
        if request.get("before"):
            request["before"](key_prefix)
        watch = Statements()
        with connection.execute_wrapper(watch):
            status, response_headers, content = _call(app, request.get("path", "/api/v1/events"), body, headers,
                                                      content_type=request.get("content_type", "application/json"),
                                                      query=request.get("query", ""))
        answers.append((status, response_headers, _normal(content), watch.sent))
    return answers


def _rows(tenant_id: str) -> dict:
    events = sorted((e.type, list(e.channels), _normal(bytes(e.payload)), e.request_id is not None)
                    for e in Event.objects.filter(tenant_id=tenant_id))
    deliveries = sorted((d.endpoint_id, d.status, d.next_attempt_at is None, d.id[-5:])
                        for d in Delivery.objects.filter(tenant_id=tenant_id))
    outbox = sorted((o.delivery_id[-5:], o.published_at is None, o.periodic, o.tenant_id)
                    for o in DeliveryOutbox.objects.filter(tenant_id=tenant_id))
    return {"events": events, "deliveries": deliveries, "outbox": outbox}


def _keys(prefix: str) -> list:
    return sorted((k.key.removeprefix(prefix), k.response_status, _normal(json.dumps(k.response_headers).encode()),
                   _normal(bytes(k.response_body)), k.fingerprint, k.path)
                  for k in IdempotencyKey.objects.filter(key__startswith=prefix))


def test_the_same_requests_get_the_same_answers_and_rows_through_either_path(settings):
    # given a tenant whose endpoints match by type, channel and filter, one of them a poll endpoint, one disabled
    event_schemas.cache_clear()  # this process has seen no type's schema (an earlier test's would be stale)
    api = make_api("differential")
    tenant = api.credential.tenant
    Tenant.objects.filter(pk=tenant.pk).update(uid="differential-uid")
    for n, options in enumerate([{}, {"event_types": ["invoice.*"]}, {"event_types": ["customer.created"]},
                                 {"channels": ["eu"]}, {"filter": {"data": {"amount": {"$gte": 1000}}}},
                                 {"kind": "poll", "url": None}, {"enabled": False}]):
        if options.get("kind") != "poll":
            options = {"url": f"https://hooks{n}.example.com/in", **options}
        else:
            options.pop("url")
        enabled = options.pop("enabled", True)
        endpoint = create_endpoint(api, **options) if "url" in options else \
            api.post("endpoints", options).json()
        if not enabled:
            assert api.patch(f"endpoints/{endpoint['id']}", {"enabled": False}).status_code == 200
    event_type_create(name="order.placed", schema={"type": "object", "required": ["order"],
                                                   "properties": {"order": {"type": "string"}}})
    platform, platform_token = credential_create_platform()
    revoked = make_api("differential-revoked")

    def expire(prefix):
        IdempotencyKey.objects.filter(key=prefix + "expired-key-1").update(expires_at="2000-01-01T00:00:00Z")

    def revoke_behind_the_cache(prefix):
        # revoked in the database only: this process's credential cache still holds it (another process revoked it)
        ApiCredential.objects.filter(pk=revoked.credential.pk).update(revoked_at="2000-01-01T00:00:00Z")

    def change_schema(prefix):
        event_type_update(event_type=EventType.objects.get(
            name="order.placed"), schema={"type": "object", "required": ["order", "total"]})

    def restore_schema(prefix):
        event_type_update(event_type=EventType.objects.get(
            name="order.placed"), schema={"type": "object", "required": ["order"],
                                          "properties": {"order": {"type": "string"}}})

    def drop_schema(prefix):
        event_type_delete(event_type=EventType.objects.get(
            name="order.placed"))

    good = {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 1200}}
    sequence = [
        {"key": "good-key-0001", "body": good},
        {"key": "good-key-0001", "body": good},                                    # replay
        {"key": "good-key-0001", "body": {"data": good["data"], "type": "invoice.paid"}},  # same fingerprint
        {"key": "good-key-0001", "body": {**good, "data": {"invoice": "in_2"}}},   # mismatch
        {"key": "good-key-0002", "body": {"type": "customer.created", "data": {"n": 1.5, "x": [None, True, "é\u2028"]},
                                          "channels": ["eu", "tenant:42"]}},
        {"key": "good-key-0003", "body": {"type": "invoice.paid", "data": {"amount": 999}, "channels": ["us"]}},
        {"key": "good-key-0004", "body": {"type": " invoice.voided ", "data": []}},
        {"key": "good-key-0005", "body": {"type": "a.b", "data": "text"}, "headers": {"Accept": "*/*"}},
        {"key": "good-key-0006", "body": good, "headers": {"Accept": "application/json"},
         "content_type": "application/json; charset=utf-8"},
        # what the general path answers (the fast path hands it over)
        {"key": "good-key-0007", "body": good, "headers": {"Accept": "text/html"}},
        {"key": "good-key-0008", "body": good, "query": "format=json"},
        {"key": "good-key-0009", "body": good, "content_type": "application/JSON"},
        {"key": "bad-key-00001", "body": {"type": "herald.test", "data": {}}},
        {"key": "bad-key-00001", "body": {"type": "herald.test", "data": {}}},     # a stored 400, replayed
        {"key": "bad-key-00002", "body": {"type": "a b", "data": {}}},
        {"key": "bad-key-00003", "body": {"type": "invoice.paid"}},
        {"key": "bad-key-00004", "body": {"type": "invoice.paid", "data": {}, "channels": ["x"] * 6}},
        {"key": "bad-key-00005", "body": b'{"type": "invoice.paid", "data": {"n": 1e400}}'},
        {"key": "bad-key-00006", "body": b'{"type": "invoice.paid", "data": '},
        {"key": "bad-key-00007", "body": b"[1, 2]"},
        {"key": "bad-key-00008", "body": b"", "content_type": ""},
        {"key": "bad-key-00009", "body": good, "content_type": "text/plain"},
        {"key": "bad-key-00010", "body": {"type": "invoice.paid", "data": "x" * 300_000}},
        {"key": None, "body": good},
        {"key": "short", "body": good},
        {"key": "bad-key-00011", "body": good, "token": "hrld_not-a-token"},
        {"key": "bad-key-00012", "body": good, "token": platform_token},           # tenant_required
        # the catalog: a valid event, an invalid one, the schema changed, restored, dropped
        {"key": "schema-key-01", "body": {"type": "order.placed", "data": {"order": "o_1"}}},
        {"key": "schema-key-02", "body": {"type": "order.placed", "data": {"order": 1}}},
        {"key": "schema-key-03", "body": {"type": "order.placed", "data": {"order": "o_1"}}, "before": change_schema},
        {"key": "schema-key-04", "body": {"type": "order.placed", "data": {"order": "o_1", "total": 1}}},
        {"key": "schema-key-05", "body": {"type": "order.placed", "data": {"order": "o_1"}}, "before": restore_schema},
        {"key": "schema-key-06", "body": {"type": "order.placed", "data": {"order": 2}}, "before": drop_schema},
        # an expired key executes again; a credential revoked behind the cache's back is 401
        {"key": "expired-key-1", "body": good},
        {"key": "expired-key-1", "body": good, "before": expire},
        {"key": "expired-key-1", "body": good},
        {"key": "revoked-key-1", "body": good, "token": revoked.token},            # cached now
        {"key": "revoked-key-1", "body": good, "token": revoked.token, "before": revoke_behind_the_cache},
        # a platform acting for the tenant: its keys are the tenant's (SPEC §10), answered by the general path
        {"key": "acting-key-01", "body": good, "token": platform_token, "path": f"/api/v1/tenants/{tenant.pk}/events"},
        {"key": "acting-key-01", "body": good, "token": platform_token, "path": "/api/v1/tenants/differential-uid/events"},
        {"key": "acting-key-01", "body": good, "token": platform_token},
    ]
    app = Application()
    answers = {}
    for fast in (True, False):
        event_type_update(event_type=EventType.objects.get_or_create(
            name="order.placed")[0], schema={"type": "object", "required": ["order"],
                                             "properties": {"order": {"type": "string"}}})
        ApiCredential.objects.filter(pk=revoked.credential.pk).update(revoked_at=None)
        prefix = f"{'fast' if fast else 'general'}-"
        before = {"rows": _rows(tenant.pk)}
        answers[fast] = _through(app, settings, fast, sequence, api.token, prefix)
        answers[fast, "rows"] = _rows(tenant.pk), before
        answers[fast, "keys"] = _keys(prefix)
        Event.objects.filter(tenant_id=tenant.pk).delete()  # (deliveries and outbox rows go with them)

    # then every answer is the same, header for header and byte for byte
    for n, (request, fast, general) in enumerate(zip(sequence, answers[True], answers[False])):
        assert fast[:3] == general[:3], (n, request, fast[:3], general[:3])
    # and so are the rows written, and the answers stored under the keys
    assert answers[True, "rows"] == answers[False, "rows"]
    assert answers[True, "keys"] == answers[False, "keys"]
    assert len(answers[True, "keys"]) > 10
    # the usual requests took the fast path: one statement, the function's (a replay and a mismatch too)
    fast_calls = [sum("herald_event_intake" in s for s in answer[3]) for answer in answers[True]]
    assert fast_calls[36] == 1  # (after the credential's lookup: its first request)
    for n in (0, 1, 2, 3, 4, 5, 6, 7, 8, 30, 33, 35):
        assert answers[True][n][3] == answers[True][n][3][:1] and fast_calls[n] == 1, (n, answers[True][n][3])
    # a type's schema seen for the first time: a second call, after the function told the schema
    assert fast_calls[27] == 2 and len(answers[True][27][3]) == 2
    # data the schema this process last saw refuses goes to the general path at once, which checks it against
    # the catalog's (restored: accepted), and the fast path knows that schema from then on
    assert fast_calls[31] == 0 and answers[True][31][0] == 202
    # data the schema refuses, an expired key, a revoked credential: the general path answers after the call
    assert fast_calls[29] == fast_calls[34] == fast_calls[37] == 1 and len(answers[True][29][3]) > 1
    for n in range(len(sequence)):
        assert not any("herald_event_intake" in s for s in answers[False][n][3]), n
    assert platform.kind == ApiCredential.PLATFORM


@pytest.fixture
def servers():
    """The API in two gunicorn processes of 20 threads each, once with the fast path and once without."""
    started = {fast: gunicorn(free_port(), workers=2, threads=20, INTAKE_FAST_PATH="true" if fast else "false")
               for fast in (True, False)}
    yield started
    for process in started.values():
        process.stop()


def test_concurrent_duplicates_execute_once_through_either_path(servers):
    api = make_api("differential-storm")
    create_endpoint(api, "https://storm.example.com/in")
    outcomes = {}
    for fast, server in servers.items():
        key = f"storm-{uuid.uuid4()}"
        bodies = [{"type": "invoice.paid", "data": {"invoice": "in_1"}}] * 30 + \
                 [{"type": "invoice.paid", "data": {"invoice": f"in_{n}"}} for n in range(2, 12)]
        barrier = threading.Barrier(len(bodies))

        def one(body):
            barrier.wait()
            return requests.post(f"{server.url}/api/v1/events", json=body, timeout=30, headers={
                "Authorization": f"Bearer {api.token}", "Idempotency-Key": key})

        with ThreadPoolExecutor(len(bodies)) as pool:
            responses = list(pool.map(one, bodies))
        executed = [r for r in responses if r.status_code == 202 and "Idempotent-Replay" not in r.headers]
        assert len(executed) == 1, [r.status_code for r in responses]
        first = executed[0]
        first_body = json.loads(first.content)["data"]
        kinds = set()
        for body, response in zip(bodies, responses):
            if response is first:
                continue
            if response.status_code == 202:
                assert body["data"] == first_body
                assert response.content == first.content and response.headers["Idempotent-Replay"] == "true"
                kinds.add("replay")
            else:
                problem = response.json()
                assert response.status_code == 409 and response.headers["Content-Type"] == "application/problem+json"
                assert problem["code"] in ("idempotency_key_in_progress", "idempotency_key_reused")
                # a duplicate of the running request is in progress; a different body is the mismatch, unless a
                # request with that same body held the key at that moment (one that got it after the first had
                # committed, on its way to the mismatch itself): in progress is then what the general path says
                if body["data"] == first_body:
                    expected = {"idempotency_key_in_progress"}
                elif sum(other["data"] == body["data"] for other in bodies) > 1:
                    expected = {"idempotency_key_reused", "idempotency_key_in_progress"}
                else:
                    expected = {"idempotency_key_reused"}
                assert problem["code"] in expected, (body, problem)
                kinds.add(problem["code"])
        event_id = json.loads(first.content)["id"]
        assert Event.objects.filter(id=event_id).count() == 1
        assert IdempotencyKey.objects.filter(key=key).count() == 1
        outcomes[fast] = kinds
    assert "idempotency_key_reused" in outcomes[True] and "idempotency_key_reused" in outcomes[False]
