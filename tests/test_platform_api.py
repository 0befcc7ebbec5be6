"""SPEC §10 line by line against the live API: gunicorn, a Celery worker and beat on the test database.

A platform credential manages tenants and acts for any of them under /api/v1/tenants/{tenant}/…; these
tests hold the two path families to the same answers, the tenants apart, each kind of credential to its
own paths, a revocation and a deletion to their word, and the endpoint quota to its limit under real
concurrency.
"""
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
import requests
from django.db import connection, transaction

from intake.credentials import credential_create_platform
from intake.models import IdempotencyKey
from tests.conftest import wait_until
from tests.processes import celery_beat, celery_worker, free_port, gunicorn
from tests.tenant_rows import owned_rows
from webhooks.models import Delivery, DeliveryOutbox, Endpoint, Tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    """The API (two gunicorn workers of eight threads: writes really run at once, and either worker can
    take all of the quota test's eight), a worker, and beat erasing deleted tenants every second."""
    started = []
    try:
        # (the creates of the quota test wait on a lock for a few seconds: no statement timeout meanwhile)
        started.append(gunicorn(free_port(), workers=2, threads=8, WEB_STATEMENT_TIMEOUT_SECONDS="60"))
        started.append(celery_worker("platform"))
        started.append(celery_beat(TENANT_ERASURE_INTERVAL_SECONDS="1"))
        yield started[0]
    finally:
        for process in reversed(started):
            process.stop()


class Caller:
    """One credential speaking to the live API."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str, **params) -> requests.Response:
        return self.session.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)

    def post(self, path: str, body=None, *, key: str | None = None) -> requests.Response:
        return self.session.post(f"{self.url}/api/v1/{path}", json=body,
                                 headers={"Idempotency-Key": key or f"key-{uuid.uuid4()}"}, timeout=30)

    def patch(self, path: str, body, *, key: str | None = None) -> requests.Response:
        return self.session.patch(f"{self.url}/api/v1/{path}", json=body,
                                  headers={"Idempotency-Key": key or f"key-{uuid.uuid4()}"}, timeout=30)

    def delete(self, path: str) -> requests.Response:
        return self.session.delete(f"{self.url}/api/v1/{path}", timeout=30)


def _ok(response: requests.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json() if response.content else {}


def _problem(response: requests.Response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code, body
    return body


@pytest.fixture
def platform(stack):
    _, token = credential_create_platform(name="test platform")
    return Caller(stack.url, token)


def _from_every_worker(caller: Caller, calls: list) -> list[requests.Response]:
    """Make each call (a function of a Caller) on a connection of its own, eight at once, so that both
    gunicorn workers serve some: a keep-alive session would stay with the one that took it."""
    def one(call):
        fresh = Caller(caller.url, caller.token)
        try:
            return call(fresh)
        finally:
            fresh.session.close()
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, calls))


def _refused_everywhere(caller: Caller, used_keys: list[str]) -> None:
    """The token is refused by every process at once, though each had just accepted it (and cached it):
    new writes execute nothing, a key it used gets no replay, reads answer 401."""
    calls = [lambda c: c.post("events", {"type": "invoice.paid", "data": {}}) for _ in range(16)]
    calls += [lambda c, key=key: c.post("portal-links", key=key) for key in used_keys]
    calls += [lambda c: c.get("events") for _ in range(16)]
    for response in _from_every_worker(caller, calls):
        _problem(response, 401, "not_authenticated")


def _cached_by_every_worker(caller: Caller) -> list[str]:
    """Writes by this token on fresh connections (so in both workers, which cache it); their keys."""
    keys = [f"key-{uuid.uuid4()}" for _ in range(24)]
    for response in _from_every_worker(caller, [lambda c, key=key: c.post("portal-links", key=key) for key in keys]):
        _ok(response, 201)
    return keys


def _tenant(platform: Caller, name: str, **fields) -> dict:
    uid = f"{name}-{uuid.uuid4().hex[:10]}"
    return _ok(platform.post("tenants", {"name": name, "uid": uid, **fields}), 201)


def _own_caller(platform: Caller, tenant: str) -> tuple[Caller, dict]:
    credential = _ok(platform.post(f"tenants/{tenant}/credentials"), 201)
    return Caller(platform.url, credential["token"]), credential


class _Form(HTMLParser):
    """The portal's open page: its CSRF token (the hidden input of its form)."""

    token = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and attrs.get("name") == "csrfmiddlewaretoken":
            self.token = attrs.get("value")


def _open_portal(link_url: str) -> requests.Session:
    """What a person does with a portal link: open it, press Continue; the browser's session."""
    browser = requests.Session()
    shown = browser.get(link_url, timeout=30)
    assert shown.status_code == 200, shown.text
    form = _Form()
    form.feed(shown.text)
    opened = browser.post(link_url, data={"csrfmiddlewaretoken": form.token}, allow_redirects=False, timeout=30)
    assert opened.status_code == 302, opened.text
    return browser


def _portal_page(browser: requests.Session, base: str) -> int:
    return browser.get(f"{base}/portal/", allow_redirects=False, timeout=30).status_code


def test_both_path_families_answer_identically_for_the_same_tenant(platform, receiver):
    tenant = _tenant(platform, "acme")
    own, _ = _own_caller(platform, tenant["uid"])
    acting = f"tenants/{tenant['uid']}/"
    by_id = f"tenants/{tenant['id']}/"

    created = platform.post(acting + "endpoints", {"url": receiver.url("/acme"), "event_types": ["invoice.*"]})
    endpoint = _ok(created, 201)
    assert urlsplit(created.headers["Location"]).path == f"/api/v1/{acting}endpoints/{endpoint['id']}"
    event = _ok(own.post("events", {"type": "invoice.paid", "data": {"n": 1}}), 202)
    (delivery,) = event["deliveries"]
    receiver.wait_for(1, "/acme")
    wait_until(lambda: own.get(f"deliveries/{delivery['id']}").json()["status"] == "succeeded", message="delivered")

    for path, params in [("endpoints", {}), (f"endpoints/{endpoint['id']}", {}),
                         (f"endpoints/{endpoint['id']}/secret", {}), ("events", {"type": "invoice.paid"}),
                         (f"events/{event['id']}", {}), ("deliveries", {"event": event["id"]}),
                         (f"deliveries/{delivery['id']}", {}), ("deliveries", {"limit": "1"}),
                         ("endpoints/ep_nothing", {}), ("deliveries", {"status": "nonsense"})]:
        mine = own.get(path, **params)
        for prefix in (acting, by_id):
            theirs = platform.get(prefix + path, **params)
            assert (theirs.status_code, theirs.json()) == (mine.status_code, mine.json()), path
    # writes too: the same answer for the same change, whichever family made it
    patched = _ok(platform.patch(acting + f"endpoints/{endpoint['id']}", {"description": "billing"}), 200)
    assert _ok(own.get(f"endpoints/{endpoint['id']}"), 200) == patched
    retried = _ok(platform.post(acting + f"deliveries/{delivery['id']}/retry"), 202)
    assert retried["id"] == delivery["id"] and retried["status"] == "pending"
    posted = platform.post(acting + "events", {"type": "invoice.paid", "data": {"n": 2}})
    assert urlsplit(posted.headers["Location"]).path == f"/api/v1/{acting}events/{posted.json()['id']}"
    assert _ok(own.get(f"events/{posted.json()['id']}"), 200)["data"] == {"n": 2}


def test_tenants_are_apart_through_the_platform_paths(platform, receiver):
    first, second = _tenant(platform, "first"), _tenant(platform, "second")
    one, two = f"tenants/{first['uid']}/", f"tenants/{second['id']}/"
    endpoint = _ok(platform.post(one + "endpoints", {"url": receiver.url("/first")}), 201)
    _ok(platform.post(two + "endpoints", {"url": receiver.url("/second")}), 201)
    event = _ok(platform.post(one + "events", {"type": "order.created", "data": {"for": "first"}}), 202)
    _ok(platform.post(two + "events", {"type": "order.created", "data": {"for": "second"}}), 202)

    for path in (f"endpoints/{endpoint['id']}", f"endpoints/{endpoint['id']}/secret", f"events/{event['id']}",
                 f"deliveries/{event['deliveries'][0]['id']}"):
        _problem(platform.get(two + path), 404, "not_found")
    _problem(platform.patch(two + f"endpoints/{endpoint['id']}", {"description": "x"}), 404, "not_found")
    _problem(platform.post(two + f"deliveries/{event['deliveries'][0]['id']}/retry"), 404, "not_found")
    _problem(platform.delete(two + f"endpoints/{endpoint['id']}"), 404, "not_found")
    assert event["id"] not in {e["id"] for e in _ok(platform.get(two + "events"), 200)["data"]}
    assert {d["event_id"] for d in _ok(platform.get(two + "deliveries"), 200)["data"]}.isdisjoint({event["id"]})

    receiver.wait_for(1, "/first")
    receiver.wait_for(1, "/second")
    assert [json.loads(r.body)["data"] for r in receiver.requests_to("/first")] == [{"for": "first"}]
    assert [json.loads(r.body)["data"] for r in receiver.requests_to("/second")] == [{"for": "second"}]
    # a tenant's own credential stays within its tenant as before
    own_second, _ = _own_caller(platform, second["uid"])
    _problem(own_second.get(f"endpoints/{endpoint['id']}"), 404, "not_found")
    _problem(platform.get(f"tenants/nobody-{uuid.uuid4().hex[:8]}/events"), 404, "not_found")


def test_each_kind_of_credential_keeps_to_its_own_paths(platform):
    tenant = _tenant(platform, "kinds")
    own, _ = _own_caller(platform, tenant["uid"])
    keys_before = IdempotencyKey.objects.count()

    for response in (platform.get("endpoints"), platform.get("events"), platform.get("deliveries/dlv_x"),
                     platform.delete("endpoints/ep_x"), platform.post("events", {"type": "a.b", "data": {}}),
                     platform.post("portal-links"), platform.patch("endpoints/ep_x", {"description": "x"})):
        _problem(response, 400, "tenant_required")
    for response in (own.get("tenants"), own.get(f"tenants/{tenant['id']}"), own.get(f"tenants/{tenant['uid']}/events"),
                     own.post("tenants", {"name": "mine"}), own.post(f"tenants/{tenant['id']}/credentials"),
                     own.patch(f"tenants/{tenant['id']}", {"name": "x"}), own.delete(f"tenants/{tenant['id']}"),
                     own.post(f"tenants/{tenant['id']}/events", {"type": "a.b", "data": {}})):
        _problem(response, 403, "forbidden")
    # refused before the operation runs: nothing was stored against a key, nothing was made
    assert IdempotencyKey.objects.count() == keys_before
    assert Tenant.objects.filter(name="mine").count() == 0
    key = f"key-{uuid.uuid4()}"
    _problem(platform.post("events", {"type": "a.b", "data": {}}, key=key), 400, "tenant_required")
    assert _ok(platform.post(f"tenants/{tenant['id']}/events", {"type": "a.b", "data": {}}, key=key), 202)
    _problem(Caller(platform.url, "hrld_not-a-token").get("tenants"), 401, "not_authenticated")


def test_uids_are_unique_and_checked(platform):
    tenant = _tenant(platform, "unique", metadata={"plan": "pro", "seats": 3}, max_endpoints=5)
    assert tenant["id"].startswith("tnt_") and tenant["metadata"] == {"plan": "pro", "seats": 3}
    conflict = _problem(platform.post("tenants", {"name": "again", "uid": tenant["uid"]}), 409, "conflict")
    assert tenant["uid"] in conflict["detail"]
    assert _ok(platform.get("tenants", uid=tenant["uid"]), 200)["data"] == [tenant]

    for body, field in [({"name": "x", "uid": "tnt_mine"}, "uid"), ({"name": "x", "uid": "has space"}, "uid"),
                        ({"name": "x", "uid": "u" * 129}, "uid"), ({"name": "x", "uid": ""}, "uid"),
                        ({"name": "x", "metadata": ["not", "an", "object"]}, "metadata"),
                        ({"name": "x", "metadata": {"blob": "é" * 2100}}, "metadata"),
                        ({"name": "x", "max_endpoints": -1}, "max_endpoints"), ({"uid": "no-name"}, "name")]:
        refused = _problem(platform.post("tenants", body), 400, "validation_error")
        assert field in refused["errors"], (body, refused)
    assert _ok(platform.post("tenants", {"name": "fits", "metadata": {"blob": "x" * 4000}}), 201)["uid"] is None
    _problem(platform.patch(f"tenants/{tenant['id']}", {"metadata": {"blob": "x" * 5000}}), 400, "validation_error")
    _problem(platform.get("tenants/tnt_01NOSUCHTENANT"), 404, "not_found")
    _problem(platform.get("tenants", limit="0"), 400, "validation_error")

    # a deleted tenant's uid is free again at once
    _ok(platform.delete(f"tenants/{tenant['uid']}"), 202)
    again = _ok(platform.post("tenants", {"name": "again", "uid": tenant["uid"]}), 201)
    assert again["id"] != tenant["id"]
    assert _ok(platform.get(f"tenants/{tenant['uid']}"), 200)["id"] == again["id"]


def test_a_revoked_credential_stops_and_ends_the_portal_sessions_it_opened(platform, stack):
    tenant = _tenant(platform, "revoked")
    own, credential = _own_caller(platform, tenant["uid"])
    assert credential["id"].startswith("cred_") and credential["token"].startswith("hrld_")
    by_own = _open_portal(_ok(own.post("portal-links"), 201)["url"])
    by_platform = _open_portal(_ok(platform.post(f"tenants/{tenant['uid']}/portal-links"), 201)["url"])
    unused_link = _ok(own.post("portal-links"), 201)["url"]
    assert _portal_page(by_own, stack.url) == _portal_page(by_platform, stack.url) == 200
    used_keys = _cached_by_every_worker(own)

    assert platform.delete(f"tenants/{tenant['uid']}/credentials/{credential['id']}").status_code == 204
    # the session its link opened ends at once; the platform's goes on; its unused link no longer opens
    assert _portal_page(by_own, stack.url) == 403
    assert _portal_page(by_platform, stack.url) == 200
    assert requests.get(unused_link, timeout=30).status_code == 410
    _refused_everywhere(own, used_keys[:8])
    _problem(platform.delete(f"tenants/{tenant['uid']}/credentials/{credential['id']}"), 404, "not_found")
    _problem(platform.delete(f"tenants/{tenant['uid']}/credentials/cred_x"), 404, "not_found")
    other = _tenant(platform, "other")
    _, others = _own_caller(platform, other["uid"])
    _problem(platform.delete(f"tenants/{tenant['uid']}/credentials/{others['id']}"), 404, "not_found")
    # the mint is stored encrypted for its replay, and replays the same token
    key = f"key-{uuid.uuid4()}"
    minted = _ok(platform.post(f"tenants/{other['uid']}/credentials", key=key), 201)
    replay = platform.post(f"tenants/{other['uid']}/credentials", key=key)
    assert replay.headers["Idempotent-Replay"] == "true" and replay.json() == minted
    stored = IdempotencyKey.objects.get(key=key)
    assert stored.response_encrypted and minted["token"].encode() not in bytes(stored.response_body)


def test_the_endpoint_quota_holds_under_concurrent_creates(platform, receiver):
    tenant = _tenant(platform, "quota", max_endpoints=2)
    acting = f"tenants/{tenant['uid']}/"
    for n in range(2):
        _ok(platform.post(acting + "endpoints", {"url": receiver.url(f"/q{n}")}), 201)
    over = _problem(platform.post(acting + "endpoints", {"url": receiver.url("/q2")}), 400, "validation_error")
    assert "max_endpoints" in over["errors"]["endpoints"][0]
    # the platform raises the limit; null goes back to the deployment's default (TENANT_MAX_ENDPOINTS, 100)
    assert _ok(platform.patch(f"tenants/{tenant['uid']}", {"max_endpoints": 3}), 200)["max_endpoints"] == 3
    _ok(platform.post(acting + "endpoints", {"url": receiver.url("/q2")}), 201)
    assert _ok(platform.patch(f"tenants/{tenant['uid']}", {"max_endpoints": None}), 200)["max_endpoints"] is None

    # eight creates at once through the API, with room for three: exactly three are made
    racing = _tenant(platform, "race", max_endpoints=3)
    barrier, answers = threading.Barrier(8), []

    def create(n: int) -> None:
        caller = Caller(platform.url, platform.token)
        barrier.wait()
        answers.append(caller.post(f"tenants/{racing['id']}/endpoints", {"url": receiver.url(f"/race{n}")}).status_code)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == [201] * 3 + [400] * 5
    assert Endpoint.objects.filter(tenant_id=racing["id"], deleted_at__isnull=True).count() == 3
    # a deleted endpoint frees its place
    first = _ok(platform.get(f"tenants/{racing['id']}/endpoints"), 200)["data"][0]
    assert platform.delete(f"tenants/{racing['id']}/endpoints/{first['id']}").status_code == 204
    _ok(platform.post(f"tenants/{racing['id']}/endpoints", {"url": receiver.url("/again")}), 201)


def test_the_quota_holds_when_creates_meet_for_sure(db):
    """The quota's lock, with the creates made to meet: this test holds the tenant's row while eight
    creates (threads, each its own PostgreSQL connection) start; each waits on it (for the quota's lock,
    or, were there none, for its endpoint's foreign key after counting), then all go at once."""
    from webhooks.services.endpoints import EndpointQuotaExceeded, endpoint_create

    tenant = Tenant.objects.create(name="meet", max_endpoints=3)
    outcomes = []

    def create(n: int) -> None:
        try:
            endpoint_create(tenant=tenant, url=f"http://127.0.0.1:9/meet{n}", event_types=[], channels=[])
            outcomes.append("made")
        except EndpointQuotaExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    with transaction.atomic():
        Tenant.objects.select_for_update().get(pk=tenant.pk)
        for thread in threads:
            thread.start()
        wait_until(lambda: _waiting_on_locks() >= 8, timeout=30, interval=0.2, message="the eight creates waiting")
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["made"] * 3 + ["refused"] * 5
    assert Endpoint.objects.filter(tenant=tenant).count() == 3


def _waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # (else a transaction sees its first look for ever)
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_deleted_tenant_stops_at_once_and_beat_erases_everything_it_owns(platform, stack, receiver, processes):
    doomed, kept = _tenant(platform, "doomed"), _tenant(platform, "kept")
    own, _ = _own_caller(platform, doomed["uid"])
    for tenant in (doomed, kept):
        acting = f"tenants/{tenant['uid']}/"
        _ok(platform.post(acting + "endpoints", {"url": receiver.url(f"/{tenant['name']}")}), 201)
        for n in range(3):
            _ok(platform.post(acting + "events", {"type": "invoice.paid", "data": {"n": n}}), 202)
    _ok(own.post("events", {"type": "invoice.paid", "data": {"n": "own"}}), 202)
    receiver.wait_for(4, "/doomed")
    receiver.wait_for(3, "/kept")
    browser = _open_portal(_ok(own.post("portal-links"), 201)["url"])
    # what is still to be sent when it is deleted: a slow endpoint (one attempt a second) with a backlog
    slow = _ok(platform.post(f"tenants/{doomed['uid']}/endpoints",
                             {"url": receiver.url("/doomed-slow"), "throttle_rate": 1}), 201)
    for n in range(12):
        _ok(platform.post(f"tenants/{doomed['uid']}/events", {"type": "invoice.paid", "data": {"n": f"late{n}"}}), 202)
    receiver.wait_for(2, "/doomed-slow")
    assert Delivery.objects.filter(endpoint_id=slow["id"], status=Delivery.PENDING).count() >= 8
    used_keys = _cached_by_every_worker(own)

    deleted = platform.delete(f"tenants/{doomed['uid']}")
    assert deleted.status_code == 202 and deleted.json()["id"] == doomed["id"]
    sent_before = len(receiver.requests_to("/doomed-slow"))
    # at once: 404 by id and uid, on every path under it; its token refused; its portal session over
    for path in (f"tenants/{doomed['uid']}", f"tenants/{doomed['id']}", f"tenants/{doomed['uid']}/events",
                 f"tenants/{doomed['id']}/endpoints"):
        _problem(platform.get(path), 404, "not_found")
    _problem(platform.post(f"tenants/{doomed['uid']}/events", {"type": "a.b", "data": {}}), 404, "not_found")
    _problem(platform.delete(f"tenants/{doomed['uid']}"), 404, "not_found")
    assert doomed["id"] not in {t["id"] for t in _ok(platform.get("tenants", limit="100"), 200)["data"]}
    assert _ok(platform.get("tenants", uid=doomed["uid"]), 200)["data"] == []
    assert _portal_page(browser, stack.url) == 403
    _refused_everywhere(own, used_keys[:8])

    # beat erases everything it owned (after the grace of a lease), and nothing of the other tenant
    wait_until(lambda: not any(owned_rows(doomed["id"]).values()), timeout=90, interval=0.5,
               message=f"the erasure of {doomed['id']}: {owned_rows(doomed['id'])}")
    assert not DeliveryOutbox.objects.exclude(delivery_id__in=Delivery.objects.values("id")).exists()
    # its backlog was never sent: nothing more reached its endpoint after the deletion (but for an
    # attempt that may have been in flight as it was deleted)
    assert len(receiver.requests_to("/doomed-slow")) <= sent_before + 1 < 12
    kept_rows = owned_rows(kept["id"])
    assert (kept_rows["webhooks.Event"], kept_rows["webhooks.Delivery"], kept_rows["webhooks.Endpoint"],
            kept_rows["intake.ApiCredential"]) == (3, 3, 1, 0)
    assert _ok(platform.get(f"tenants/{kept['uid']}/events"), 200)["data"]


def test_a_credential_made_while_its_tenant_is_deleted_never_works(platform):
    """`POST /tenants/{t}/credentials` and `DELETE /tenants/{t}` sent at the same moment, round after round,
    each on a connection of its own: whichever wins, no live credential of a deleted tenant is left, and a
    token the POST handed out is refused."""
    from intake.models import ApiCredential

    leaked, made = [], 0
    for round_number in range(40):
        tenant = _tenant(platform, f"race-{round_number}")
        callers = [Caller(platform.url, platform.token) for _ in range(2)]
        go, answers = threading.Barrier(2), [None, None]

        def mint() -> None:
            go.wait()
            answers[0] = callers[0].post(f"tenants/{tenant['id']}/credentials")

        def delete() -> None:
            go.wait()
            answers[1] = callers[1].delete(f"tenants/{tenant['id']}")

        threads = [threading.Thread(target=mint), threading.Thread(target=delete)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert answers[1].status_code == 202, answers[1].text
        assert answers[0].status_code in (201, 404), answers[0].text
        if answers[0].status_code == 201:
            made += 1
            token = Caller(platform.url, answers[0].json()["token"])
            if token.get("endpoints").status_code != 401:
                leaked.append((tenant["id"], "answered"))
        live = ApiCredential.objects.filter(tenant_id=tenant["id"], revoked_at__isnull=True).count()
        if live:
            leaked.append((tenant["id"], f"{live} live"))
        for caller in callers:
            caller.session.close()
    assert leaked == [], f"{len(leaked)} of 40 rounds left a live credential ({made} minted): {leaked}"


def test_a_platform_key_is_its_tenants_and_goes_with_it(platform):
    """SPEC §10: a platform's key on /tenants/{tenant}/… is scoped to the tenant's id, whether the path named
    its id or its uid. A new tenant given a deleted tenant's uid executes a same-key POST (no replay of the
    old tenant's answer, even before the erasure ran), and the erasure takes the old tenant's stored answers
    with it. Two live tenants are two scopes for one key."""
    uid = f"reused-{uuid.uuid4().hex[:10]}"
    old = _ok(platform.post("tenants", {"name": "old", "uid": uid}), 201)
    other = _tenant(platform, "other")
    key, body = f"key-{uuid.uuid4()}", {"type": "invoice.paid", "data": {"secret-ish": "old tenant's data"}}
    first = platform.post(f"tenants/{uid}/events", body, key=key)
    assert first.status_code == 202, first.text
    assert platform.post(f"tenants/{uid}/events", body, key=key).headers.get("Idempotent-Replay") == "true"
    # the same key for another tenant is another request (not idempotency_key_reused)
    elsewhere = platform.post(f"tenants/{other['uid']}/events", body, key=key)
    assert elsewhere.status_code == 202 and "Idempotent-Replay" not in elsewhere.headers, elsewhere.text
    assert IdempotencyKey.objects.filter(tenant_id=old["id"]).count() == 1

    _ok(platform.delete(f"tenants/{uid}"), 202)
    # a path naming no live tenant: 404 before the key is taken, nothing stored
    _problem(platform.post(f"tenants/{uid}/events", body, key=f"key-{uuid.uuid4()}"), 404, "not_found")
    new = _ok(platform.post("tenants", {"name": "new", "uid": uid}), 201)
    second = platform.post(f"tenants/{uid}/events", body, key=key)
    assert second.status_code == 202 and "Idempotent-Replay" not in second.headers, second.text
    assert second.json()["id"] != first.json()["id"]
    assert IdempotencyKey.objects.filter(tenant_id=new["id"]).count() == 1

    # beat's erasure takes the old tenant's stored answers (the platform's), and leaves the new one's
    wait_until(lambda: not any(owned_rows(old["id"]).values()), timeout=90, interval=0.5,
               message=f"the erasure of {old['id']}: {owned_rows(old['id'])}")
    assert not IdempotencyKey.objects.filter(tenant_id=old["id"]).exists()
    assert IdempotencyKey.objects.filter(tenant_id=new["id"]).count() == 1
    assert platform.post(f"tenants/{uid}/events", body, key=key).headers.get("Idempotent-Replay") == "true"
