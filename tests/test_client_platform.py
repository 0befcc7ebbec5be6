"""The Python client's platform calls (tenants, acting for a tenant, its credentials) against the live API.

These need the platform API (`create_credential --platform`, `/api/v1/tenants…`); the client's side
is written to its contract, and these tests prove the two meet: real gunicorn, a Celery worker,
PostgreSQL, a platform credential made by the management command as an operator makes one.
"""
import subprocess
import sys
import uuid

import pytest

import herald_client
from herald_client import Herald, RetryInfo, RetryPolicy, verify
from tests.conftest import subprocess_env, wait_until
from tests.processes import ROOT
from tests.test_client import server  # noqa: F401 - the same live API and worker, started for this module

pytestmark = pytest.mark.django_db(transaction=True)


def _platform_token() -> str:
    """`manage.py create_credential --platform`: the token is the last line on stdout."""
    made = subprocess.run([sys.executable, "manage.py", "create_credential", "--platform"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture
def retries() -> list[RetryInfo]:
    return []


@pytest.fixture
def platform(server, retries):  # noqa: F811 - the imported fixture
    with Herald(server.url, _platform_token(), retry=RetryPolicy(base_delay=0.05), on_retry=retries.append) as client:
        yield client


def _uid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


def test_tenants_are_created_read_listed_and_changed(platform, retries):
    uid = _uid("acme")
    tenant = platform.tenants.create("Acme", uid=uid, max_endpoints=2, metadata={"plan": "pro"})
    assert tenant["id"].startswith("tnt_")
    assert (tenant["uid"], tenant["name"], tenant["max_endpoints"], tenant["metadata"]) == (
        uid, "Acme", 2, {"plan": "pro"})
    assert platform.tenants.get(tenant["id"]) == platform.tenants.get(uid) == tenant
    assert list(platform.tenants.list(uid=uid)) == [tenant]

    with pytest.raises(herald_client.Conflict) as taken:
        platform.tenants.create("Acme again", uid=uid)
    assert taken.value.status == 409
    with pytest.raises(herald_client.ValidationError) as refused:
        platform.tenants.create("Bad", uid="tnt_mine", metadata={"blob": "x" * 5000})
    assert {"uid", "metadata"} <= set(refused.value.errors)

    changed = platform.tenants.update(uid, name="Acme EU", metadata={"plan": "enterprise"})
    assert (changed["id"], changed["name"], changed["metadata"], changed["max_endpoints"]) == (
        tenant["id"], "Acme EU", {"plan": "enterprise"}, 2)
    assert platform.tenant(uid).update(max_endpoints=None)["max_endpoints"] in (None, 100)
    assert platform.tenant(tenant["id"]).get()["name"] == "Acme EU"

    # more tenants than one page holds: the iterator goes through them all, newest first
    more = [platform.tenants.create(f"Tenant {n}", uid=_uid(f"t{n}"))["id"] for n in range(3)]
    listed = [t["id"] for t in platform.tenants.list(limit=2)]
    assert listed[:3] == more[::-1] and tenant["id"] in listed
    assert retries == []


def test_a_platform_makes_every_tenant_call_for_its_tenant(platform, receiver):
    uid = _uid("globex")
    platform.tenants.create("Globex", uid=uid, max_endpoints=2)
    globex = platform.tenant(uid)

    endpoint = globex.endpoints.create(receiver.url("/globex"), event_types=["invoice.*"])
    endpoint_id = endpoint["id"]
    assert globex.endpoints.get(endpoint_id) == endpoint
    assert [e["id"] for e in globex.endpoints.list()] == [endpoint_id]
    secret = globex.endpoints.secret(endpoint_id)
    assert globex.endpoints.update(endpoint_id, description="billing")["description"] == "billing"

    event = globex.events.create("invoice.paid", {"invoice": "in_g1"})
    assert globex.events.get(event["id"])["id"] == event["id"]
    assert [e["id"] for e in globex.events.list(type="invoice.paid")] == [event["id"]]
    (request,) = receiver.wait_for(1, "/globex")
    assert verify(request.body, request.headers, secret)["data"] == {"invoice": "in_g1"}
    ((delivery_ref),) = event["deliveries"]
    wait_until(lambda: globex.deliveries.get(delivery_ref["id"])["status"] == "succeeded", message="delivered")
    assert [d["id"] for d in globex.deliveries.list(event=event["id"])] == [delivery_ref["id"]]
    assert globex.deliveries.retry(delivery_ref["id"])["status"] == "pending"

    globex.endpoints.rotate_secret(endpoint_id)
    assert globex.endpoints.secret(endpoint_id) != secret
    assert globex.endpoints.test(endpoint_id)["type"] == "herald.test"
    assert globex.portal_links.create()["url"].startswith("http")

    # the tenant's own limit, and the paths without a tenant
    globex.endpoints.create(receiver.url("/globex-2"))
    with pytest.raises(herald_client.ValidationError):
        globex.endpoints.create(receiver.url("/globex-3"))
    with pytest.raises(herald_client.TenantRequired) as required:
        list(platform.endpoints.list())
    assert required.value.status == 400
    with pytest.raises(herald_client.NotFound):
        list(platform.tenant(_uid("nobody")).events.list())

    globex.endpoints.delete(endpoint_id)
    with pytest.raises(herald_client.NotFound):
        globex.endpoints.get(endpoint_id)


def test_tenant_credentials_are_made_and_revoked(platform, server):  # noqa: F811
    uid = _uid("initech")
    tenant = platform.tenants.create("Initech", uid=uid)
    credential = platform.tenant(uid).credentials.create()
    assert credential["id"] and credential["token"] and credential["created_at"]

    own = Herald(server.url, credential["token"])
    event = own.events.create("invoice.paid", {"invoice": "in_i1"})
    assert [e["id"] for e in platform.tenant(tenant["id"]).events.list()] == [event["id"]]
    with pytest.raises(herald_client.Forbidden) as forbidden:
        list(own.tenants.list())
    assert forbidden.value.status == 403

    platform.tenant(uid).credentials.revoke(credential["id"])

    def refused() -> bool:
        try:
            list(own.endpoints.list())
        except herald_client.NotAuthenticated:
            return True
        return False

    wait_until(refused, timeout=15, message="the revoked token to be refused")


def test_a_platforms_keys_are_each_tenants_own(platform, server):  # noqa: F811
    """SPEC §10: a platform's key under /tenants/{tenant}/ belongs to that tenant (by its id, named by uid or
    id alike): the same key for another tenant is another request, and the id spells the same scope."""
    first, second = _uid("a"), _uid("b")
    for uid in (first, second):
        platform.tenants.create(uid, uid=uid)
    key = f"platform-{uuid.uuid4()}"

    event = platform.tenant(first).events.create("invoice.paid", {"n": 1}, idempotency_key=key)
    replay = platform.request("POST", f"tenants/{first}/events", json={"type": "invoice.paid", "data": {"n": 1}},
                              idempotency_key=key)
    assert replay.replayed and replay.json() == event
    # the same key for another tenant's path: that tenant's own request, executed
    assert platform.tenant(second).events.create("invoice.paid", {"n": 1}, idempotency_key=key)["id"] != event["id"]
    # the first tenant by its id: the same scope, another path (the fingerprint's), so the key is reused
    first_id = platform.tenant(first).get()["id"]
    with pytest.raises(herald_client.IdempotencyKeyReused):
        platform.tenant(first_id).events.create("invoice.paid", {"n": 1}, idempotency_key=key)

    # the tenant's own credential has keys of its own: the same key there is a new request
    own = Herald(server.url, platform.tenant(first).credentials.create()["token"])
    assert own.events.create("invoice.paid", {"n": 1}, idempotency_key=key)["id"] != event["id"]


def test_deleting_a_tenant_stops_it_at_once(platform, server, receiver):  # noqa: F811
    uid = _uid("umbrella")
    platform.tenants.create("Umbrella", uid=uid)
    umbrella = platform.tenant(uid)
    umbrella.endpoints.create(receiver.url("/umbrella"))
    own = Herald(server.url, umbrella.credentials.create()["token"], retry=herald_client.NO_RETRIES)

    assert umbrella.delete() is None

    with pytest.raises(herald_client.NotFound):
        umbrella.get()
    with pytest.raises(herald_client.NotFound):
        list(umbrella.endpoints.list())
    with pytest.raises(herald_client.NotAuthenticated):
        list(own.events.list())


def test_the_event_type_catalog_is_written_by_the_platform_and_checked_at_intake(platform, server):  # noqa: F811
    name = f"invoice.paid{uuid.uuid4().hex[:8]}"
    schema = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}
    made = platform.event_types.create(name, description="An invoice was paid.", schema=schema, example={"amount": 5})
    assert (made["name"], made["schema"], made["example"]) == (name, schema, {"amount": 5})
    assert platform.event_types.get(name) == made
    assert name in [entry["name"] for entry in platform.event_types.list()]
    with pytest.raises(herald_client.Conflict):
        platform.event_types.create(name)
    with pytest.raises(herald_client.ValidationError) as refused:
        platform.event_types.create(f"{name}x", schema={"type": "object"}, example=[1])
    assert refused.value.errors

    # a tenant reads the catalog, may not write it, and its events are checked against it
    tenant = platform.tenants.create("Catalog reader", uid=_uid("reader"))
    token = platform.tenant(tenant["id"]).credentials.create()["token"]
    with Herald(server.url, token) as reader:
        assert name in [entry["name"] for entry in reader.event_types.list()]
        with pytest.raises(herald_client.Forbidden):
            reader.event_types.create(f"{name}.mine")
        with pytest.raises(herald_client.ValidationError) as invalid:
            reader.events.create(name, {"amount": "five"})
        assert "/data/amount" in invalid.value.errors
        assert reader.events.create(name, {"amount": 5})["type"] == name

    changed = platform.event_types.update(name, schema=None)
    assert changed["schema"] is None
    platform.event_types.delete(name)
    with pytest.raises(herald_client.NotFound):
        platform.event_types.get(name)
