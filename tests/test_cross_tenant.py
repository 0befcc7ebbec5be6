"""One tenant's token against everything of another tenant's and the platform's, generated from the URL
resolver (SPEC §2, §10): every API route and every method its view takes, so a route added later is
covered without editing a list.

Tenant A's token on tenant B's objects is 404; on the platform's routes 403; a platform token on a
tenant route without /tenants/{tenant}/ is 400. Each call is made plain, with each header a client
could use to move the mount point or rewrite the URL (gunicorn believed `SCRIPT_NAME` from loopback),
and with path tricks; all against the real gunicorn, where those headers are parsed. B's rows in every
model it owns (tests/tenant_rows.py, from the app registry) are counted before and after: none changes,
and none of B's data shows in any answer. The same routes are then called in-process with the scope rule
switched off, to hold each view to its own check of the credential's kind (the defence behind it).
"""
import http.client
import json
import threading
import uuid
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from intake.credentials import credential_create_platform
from tests.conftest import Api, create_endpoint, make_api
from tests.processes import free_port, gunicorn, warm
from tests.tenant_rows import owned_state
from webhooks.models import EventType, Tenant

pytestmark = pytest.mark.django_db(transaction=True)

API_PREFIX = "api/v1/"
METHODS = ("get", "post", "put", "patch", "delete")
# Headers with which a client could try to move the mount point or have the URL rewritten.
PREFIX_HEADERS = ("SCRIPT_NAME", "Script-Name", "X-Script-Name", "X-Forwarded-Prefix", "X-Original-URL",
                  "X-Rewrite-URL")
MOUNT = "/x"
REFUSALS = {400, 403, 404, 405}


@dataclass(frozen=True)
class Route:
    path: str          # "/api/v1/tenants/<str:tenant>/events/<str:event_id>"
    view: type
    params: tuple

    @property
    def methods(self) -> list[str]:
        """The methods the view takes (HEAD wherever GET is, as Django answers it), OPTIONS aside."""
        methods = [m.upper() for m in METHODS if hasattr(self.view, m)]
        return methods + ["HEAD"] if "GET" in methods else methods

    @property
    def platform(self) -> bool:
        return self.path == "/api/v1/tenants" or self.path.startswith("/api/v1/tenants/")

    @property
    def deployment(self) -> bool:
        return self.path.startswith("/api/v1/event-types")


def api_routes() -> list[Route]:
    """Every route under /api/v1/ from Django's URL resolver."""
    routes = []

    def walk(patterns, prefix: str):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                route = prefix + str(pattern.pattern)
                if route.startswith(API_PREFIX):
                    view = getattr(pattern.callback, "cls", None) or pattern.callback.view_class
                    params = tuple(part.split(">")[0].split(":")[-1] for part in route.split("<")[1:])
                    routes.append(Route("/" + route, view, params))

    walk(get_resolver().url_patterns, "")
    assert len(routes) > 20, routes
    return routes


@dataclass
class World:
    a: Api
    b: Api
    platform_token: str
    b_values: dict            # route parameter -> B's object of that kind
    b_secrets: list = field(default_factory=list)   # strings of B's that no answer to A may contain


def _world() -> World:
    a, b = make_api(f"tenant-a-{uuid.uuid4().hex[:6]}"), make_api(f"tenant-b-{uuid.uuid4().hex[:6]}")
    marker = f"b-private-{uuid.uuid4().hex}"
    Tenant.objects.filter(pk=b.tenant.pk).update(uid=f"uid-{marker}")
    for api in (a, b):
        create_endpoint(api, f"https://{api.tenant.name}.example.com/hook")
    endpoint = create_endpoint(b, f"https://{marker}.example.com/hook")
    event = b.send_event("invoice.paid", {"marker": marker})
    recovery = b.post(f"endpoints/{endpoint['id']}/recover",
                      {"since": (timezone.now() - timedelta(hours=1)).isoformat()})
    assert recovery.status_code == 202, recovery.content
    assert b.post("portal-links").status_code == 201
    EventType.objects.get_or_create(name="invoice.paid")
    _, platform_token = credential_create_platform(name="cross-tenant platform")
    values = {
        "tenant": b.tenant.pk, "endpoint_id": endpoint["id"], "event_id": event["id"],
        "delivery_id": event["deliveries"][0]["id"], "recovery_id": recovery.json()["id"],
        "credential_id": f"cred_{b.credential.pk}", "name": "invoice.paid",
    }
    return World(a, b, platform_token, values, [marker, endpoint["secret"], b.token])


def _fill(route: Route, values: dict) -> str:
    path = route.path
    for param in route.params:
        assert param in values, f"a new route parameter {param!r} ({route.path}): say which of B's objects it names"
        path = path.replace(f"<str:{param}>", values[param])
    return path


def _body(route: Route) -> bytes:
    if route.path.endswith("/events"):
        return json.dumps({"type": "invoice.paid", "data": {"n": 1}}).encode()
    if route.path.endswith("/endpoints"):
        return json.dumps({"url": "https://evil.example.com/"}).encode()
    if route.path == "/api/v1/tenants":
        return json.dumps({"name": "evil"}).encode()
    return b"{}"


def _tricks(path: str) -> list[str]:
    """The same route spelled otherwise: doubled slashes, encoded slashes, dot segments, case."""
    rest = path.removeprefix("/api/v1/")
    return [
        "/" + path, "/api/v1//" + rest, "/api%2Fv1/" + rest, "/api/v1/" + rest.replace("/", "%2F"),
        "/api/./v1/" + rest, "/api/v1/./" + rest, "/api/v1/x/../" + rest,
        path.upper(), "/api/v1/" + rest[:1].upper() + rest[1:], "/API/v1/" + rest,
    ]


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    headers: tuple
    expect: frozenset | None   # None: A's own route, any answer below 500
    what: str
    body: bytes = b"{}"
    key: bool = True


def _calls(world: World) -> list[Call]:
    calls = []
    for route in api_routes():
        path = _fill(route, world.b_values)
        names_b = route.platform or any(p != "name" for p in route.params)
        for method in route.methods:
            if route.platform:
                plain = frozenset({403})
            elif route.deployment:
                plain = frozenset({200}) if (method in ("GET", "HEAD") and not route.params) else frozenset({403})
            elif names_b:
                plain = frozenset({404})
            else:
                plain = None
            attack = frozenset(REFUSALS) if names_b else None
            what, body = f"{method} {route.path}", _body(route)
            calls.append(Call(method, path, (), plain, what + " plain", body))
            for header in PREFIX_HEADERS:
                value = path if header in ("X-Original-URL", "X-Rewrite-URL") else MOUNT
                calls.append(Call(method, MOUNT + path, ((header, value),), attack, f"{what} {header} mounted", body))
                calls.append(Call(method, path, ((header, MOUNT),), plain, f"{what} {header} plain path", body))
            for trick in _tricks(path):
                calls.append(Call(method, trick, (), attack, f"{what} as {trick}", body))
            if method in ("POST", "PATCH"):
                calls.append(Call(method, MOUNT + path, (("SCRIPT_NAME", MOUNT),), attack,
                                  f"{what} SCRIPT_NAME mounted, no key", body, key=False))
    return calls


class Raw:
    """Requests sent as written (http.client: no normalisation of the path), one keep-alive connection
    per thread."""

    def __init__(self, port: int):
        self.port = port
        self.local = threading.local()

    def send(self, method: str, path: str, headers: dict, body: bytes | None) -> tuple[int, str, bytes]:
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.getheader("Content-Type", ""), response.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    process = gunicorn(free_port(), workers=1, threads=4)
    try:
        yield warm(process)
    finally:
        process.stop()


def test_no_tenant_reaches_another_or_the_platform_through_any_route_header_or_path(server):
    # given: tenants A and B, B with one object of every kind a route names, and a platform
    world = _world()
    b_before, tenants_before, types_before = owned_state(world.b.tenant.pk), Tenant.objects.count(), \
        EventType.objects.count()
    raw = Raw(int(server.url.rsplit(":", 1)[1]))
    calls = _calls(world)

    def one(call: Call):
        headers = {"Authorization": f"Bearer {world.a.token}", **dict(call.headers)}
        body = None
        if call.method in ("POST", "PATCH", "PUT"):
            headers["Content-Type"] = "application/json"
            if call.key:
                headers["Idempotency-Key"] = f"key-{uuid.uuid4()}"
            body = call.body
        return call, raw.send(call.method, call.path, headers, body)

    # when: A's token makes every call
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, calls))

    # then: each is refused as the route's kind says, as a problem; nothing of B's is shown or changed
    wrong = []
    for call, (status, content_type, body) in answers:
        leaked = [secret for secret in world.b_secrets if secret.encode() in body]
        if status >= 500 or leaked or (call.expect is not None and status not in call.expect) or (
                status >= 400 and not content_type.startswith("application/problem+json")):
            wrong.append(f"{call.what} ({call.method} {call.path} {dict(call.headers)}): {status} {content_type} "
                         f"{body[:160]!r}{' LEAKED' if leaked else ''}")
    assert not wrong, f"{len(wrong)} of {len(calls)} calls:\n" + "\n".join(wrong[:40])
    assert owned_state(world.b.tenant.pk) == b_before
    assert (Tenant.objects.count(), EventType.objects.count()) == (tenants_before, types_before)

    # and: OPTIONS describes a route, never an object: on a route naming B's objects A gets exactly what it
    # gets for ids nobody has (so no answer tells that B's exist), and on the platform's routes a 403
    made_up = {param: f"{value.split('_', 1)[0]}_00000000000000000000000000" if "_" in value else "made-up"
               for param, value in world.b_values.items()}
    auth = {"Authorization": f"Bearer {world.a.token}"}
    for route in api_routes():
        named_b = raw.send("OPTIONS", _fill(route, world.b_values), auth, None)
        assert named_b[0] < 500, (route.path, named_b)
        if route.platform:
            assert named_b[0] == 403, (route.path, named_b)
        elif route.params:
            assert named_b == raw.send("OPTIONS", _fill(route, made_up), auth, None), route.path

    # and: the platform's token on a tenant route without /tenants/{tenant}/ is 400 `tenant_required`
    for route in api_routes():
        if route.platform or route.deployment:
            continue
        for method in route.methods:
            headers = {"Authorization": f"Bearer {world.platform_token}", "Content-Type": "application/json",
                       "Idempotency-Key": f"key-{uuid.uuid4()}"}
            status, _, body = raw.send(method, _fill(route, world.b_values), headers,
                                       b"{}" if method in ("POST", "PATCH") else None)
            assert status == 400 and (method == "HEAD" or b"tenant_required" in body), (method, route.path, status,
                                                                                      body)
    assert owned_state(world.b.tenant.pk) == b_before


def test_each_view_checks_the_credential_kind_itself(monkeypatch):
    """With the scope rule switched off (as if a server handed Django a path it got wrong), every platform
    view still refuses a tenant's token (403) and every tenant view a platform's token without
    /tenants/{tenant}/ (400); a tenant token through /tenants/{tenant}/ is refused (403) by the tenant view."""
    from intake import permissions
    from intake.idempotency import middleware

    world = _world()
    b_before = owned_state(world.b.tenant.pk)
    monkeypatch.setattr(permissions, "scope_refusal", lambda credential, path: None)
    monkeypatch.setattr(middleware, "scope_refusal", lambda credential, path: None)
    wrong = []
    for route in api_routes():
        if route.deployment:
            continue
        path = _fill(route, world.b_values)
        token, expect = ((world.a.token, 403) if route.platform else (world.platform_token, 400))
        for method in route.methods:
            response = world.a.client.generic(
                method, path, _body(route) if method in ("POST", "PATCH") else "", content_type="application/json",
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": f"key-{uuid.uuid4()}"})
            if response.status_code != expect:
                wrong.append(f"{method} {route.path}: {response.status_code} {response.content[:120]!r}")
    assert not wrong, "\n".join(wrong)
    assert owned_state(world.b.tenant.pk) == b_before


def test_a_mount_point_the_server_believed_changes_no_scope(api, other_api):
    """In-process, a WSGI environ whose SCRIPT_NAME came from a client (`request.path` = /x/api/v1/…): the
    scope rule and the idempotency guard go by the route, so a tenant's token is still 403 on the platform's
    routes and a write still needs its key."""
    tenant_b = other_api.tenant
    listed = api.client.get("/api/v1/tenants", SCRIPT_NAME=MOUNT, headers={"Authorization": f"Bearer {api.token}"})
    assert listed.status_code == 403, listed.content
    minted = api.client.post(f"/api/v1/tenants/{tenant_b.pk}/credentials", "{}", content_type="application/json",
                             SCRIPT_NAME=MOUNT, headers={"Authorization": f"Bearer {api.token}",
                                                         "Idempotency-Key": "key-minted-1"})
    assert minted.status_code == 403, minted.content
    keyless = api.client.post("/api/v1/events", json.dumps({"type": "a.b", "data": {}}),
                              content_type="application/json", SCRIPT_NAME=MOUNT,
                              headers={"Authorization": f"Bearer {api.token}"})
    assert keyless.status_code == 400 and keyless.json()["code"] == "idempotency_key_missing", keyless.content


def test_the_script_name_attack_against_gunicorn(server, api, other_api):
    """The attack as found: a tenant's token with `SCRIPT_NAME: /x` and the path /x/api/v1/tenants… listed every
    tenant, minted a credential for another and posted its events without a key; with the header and the
    plain path gunicorn answered its own HTML 500. Now the header is not believed: the first are no route
    (404), the last is the call it would be without the header."""
    raw = Raw(int(server.url.rsplit(":", 1)[1]))
    tenant_b = other_api.tenant
    before = owned_state(tenant_b.pk)
    auth = {"Authorization": f"Bearer {api.token}", "SCRIPT_NAME": MOUNT, "Content-Type": "application/json"}

    listed = raw.send("GET", f"{MOUNT}/api/v1/tenants", auth, None)
    minted = raw.send("POST", f"{MOUNT}/api/v1/tenants/{tenant_b.pk}/credentials",
                      {**auth, "Idempotency-Key": "key-minted-1"}, b"{}")
    posted = raw.send("POST", f"{MOUNT}/api/v1/tenants/{tenant_b.pk}/events", auth,
                      json.dumps({"type": "invoice.paid", "data": {}}).encode())
    for status, content_type, body in (listed, minted, posted):
        assert (status, content_type) == (404, "application/problem+json"), (status, body)
    plain = raw.send("GET", "/api/v1/endpoints", auth, None)
    assert plain[0] == 200 and plain[1] == "application/json", plain
    assert owned_state(tenant_b.pk) == before
