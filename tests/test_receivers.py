"""What receivers ask for (SPEC §15): v1a (ed25519) signatures and payload filters, through the API, the
worker and the Python client."""
import base64
import json
import time

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from standardwebhooks import Webhook

from herald_client import WebhookVerificationError, WebhookVerifier, verify
from tests.conftest import create_endpoint
from tests.processes import celery_worker
from webhooks import filters
from webhooks.delivery import signing
from webhooks.models import Endpoint, EndpointSecret

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(django_db_setup):
    # Per test: a worker left running across the module's other tests deadlocks their database flush.
    process = celery_worker("receivers", concurrency=1)
    yield process
    process.stop()


def _endpoint(api, url="https://hooks.example.com/herald", **extra):
    return create_endpoint(api, url, **extra)


# --- v1a -----------------------------------------------------------------------------------------------


def test_a_v1a_endpoint_shows_only_its_public_key_and_keeps_the_private_one_encrypted(api):
    response = api.post("endpoints", {"url": "https://hooks.example.com/x", "signature": "v1a"})
    assert response.status_code == 201, response.content
    endpoint = response.json()
    assert endpoint["signature"] == "v1a"
    shown = api.get(f"endpoints/{endpoint['id']}/secret")
    assert shown.status_code == 200 and shown["Cache-Control"] == "no-store"
    assert list(shown.json()) == ["public_key"]
    public_key = shown.json()["public_key"]
    assert public_key.startswith("whpk_") and len(base64.b64decode(public_key.removeprefix("whpk_"))) == 32
    stored = EndpointSecret.objects.get(endpoint_id=endpoint["id"])
    private_key = stored.secret
    assert private_key.startswith("whsk_") and signing.public_key(private_key) == public_key
    assert "whsk_" not in stored.encrypted_secret  # a Fernet token at rest
    raw = private_key.removeprefix("whsk_")
    # no answer, nor any stored idempotent replay, carries the private key
    bodies = [response.content, shown.content, api.get("endpoints").content,
              api.get(f"endpoints/{endpoint['id']}").content,
              api.patch(f"endpoints/{endpoint['id']}", {"description": "x"}).content,
              api.post(f"endpoints/{endpoint['id']}/rotate-secret").content]
    assert not [body for body in bodies if b"whsk_" in body or raw.encode() in body]
    from intake.models import IdempotencyKey

    assert not [key.pk for key in IdempotencyKey.objects.all() if b"whsk_" in bytes(key.response_body or b"")]


def test_v1a_signs_with_ed25519_and_the_client_verifies_with_the_public_key():
    private_key = signing.generate_signing_key(signing.V1A)
    public_key = signing.public_key(private_key)
    body = '{"type":"a.b","data":{"é":1}}'.encode()
    headers = signing.webhook_headers(secrets=[private_key], msg_id="evt_1", timestamp=int(time.time()),
                                      body=body, user_agent="t")
    assert headers["webhook-signature"].startswith("v1a,")
    assert verify(body, headers, public_key) == {"type": "a.b", "data": {"é": 1}}
    # a tampered body, another key, another id: refused
    with pytest.raises(WebhookVerificationError):
        verify(body + b" ", headers, public_key)
    with pytest.raises(WebhookVerificationError):
        verify(body, headers, signing.public_key(signing.generate_signing_key(signing.V1A)))
    with pytest.raises(WebhookVerificationError):
        verify(body, {**headers, "webhook-id": "evt_2"}, public_key)
    # a v1 secret does not verify a v1a signature, nor the other way round
    with pytest.raises(WebhookVerificationError):
        verify(body, headers, signing.generate_secret())
    with pytest.raises(ValueError):
        WebhookVerifier("whpk_" + base64.b64encode(b"short").decode())


def test_a_v1a_delivery_verifies_with_the_public_key_only(api, receiver, worker):
    endpoint = _endpoint(api, receiver.url("/hook"), signature="v1a")
    event = api.send_event("invoice.paid", {"amount": 1})
    (request,) = receiver.wait_for(1)
    assert request.headers["webhook-signature"].startswith("v1a,")
    assert verify(request.body, request.headers, endpoint["secret"])["data"] == {"amount": 1}
    assert request.headers["webhook-id"] == event["id"]
    with pytest.raises(Exception):  # the standard's HMAC library knows no v1a: it finds no signature
        Webhook(signing.generate_secret()).verify(request.body, request.headers)


def test_changing_the_scheme_is_a_rotation_and_both_keys_sign_for_a_day(api, receiver, worker):
    endpoint = _endpoint(api, receiver.url("/hook"))
    old_secret = endpoint["secret"]
    answer = api.patch(f"endpoints/{endpoint['id']}", {"signature": "v1a"})
    assert answer.status_code == 200 and answer.json()["signature"] == "v1a"
    public_key = api.get(f"endpoints/{endpoint['id']}/secret").json()["public_key"]
    api.send_event("invoice.paid", {"amount": 2})
    (request,) = receiver.wait_for(1)
    schemes = sorted(part.split(",")[0] for part in request.headers["webhook-signature"].split(" "))
    assert schemes == ["v1", "v1a"]
    Webhook(old_secret).verify(request.body, request.headers)  # the old receiver still verifies
    verify(request.body, request.headers, public_key)  # and the new one
    verify(request.body, request.headers, [old_secret, public_key])
    # a rotation of a v1a endpoint issues another ed25519 key, and the one before still signs beside it
    api.post(f"endpoints/{endpoint['id']}/rotate-secret")
    new_key = api.get(f"endpoints/{endpoint['id']}/secret").json()["public_key"]
    assert new_key != public_key
    api.send_event("invoice.paid", {"amount": 3})
    (_, request) = receiver.wait_for(2)
    assert sorted(part.split(",")[0] for part in request.headers["webhook-signature"].split(" ")) == ["v1", "v1a", "v1a"]
    verify(request.body, request.headers, new_key)
    verify(request.body, request.headers, public_key)
    # patching the scheme it already has issues nothing
    before = EndpointSecret.objects.filter(endpoint_id=endpoint["id"]).count()
    api.patch(f"endpoints/{endpoint['id']}", {"signature": "v1a"})
    assert EndpointSecret.objects.filter(endpoint_id=endpoint["id"]).count() == before


def test_poll_messages_carry_the_v1a_headers(api):
    response = api.post("endpoints", {"kind": "poll", "signature": "v1a"})
    endpoint = response.json()
    public_key = api.get(f"endpoints/{endpoint['id']}/secret").json()["public_key"]
    api.send_event("invoice.paid", {"n": 1})
    (message,) = api.get(f"endpoints/{endpoint['id']}/messages").json()["data"]
    assert message["headers"]["webhook-signature"].startswith("v1a,")
    assert verify(message["body"].encode(), message["headers"], public_key)["data"] == {"n": 1}


def test_an_unknown_scheme_is_refused(api):
    response = api.post("endpoints", {"url": "https://hooks.example.com/x", "signature": "v2"})
    assert response.status_code == 400 and "signature" in response.json()["errors"]


# --- filters -------------------------------------------------------------------------------------------


def _delivered_to(event: dict) -> set[str]:
    return {delivery["endpoint_id"] for delivery in event["deliveries"]}


def test_only_matching_events_are_delivered_to_a_filtered_endpoint(api):
    big = _endpoint(api, filter={"data": {"amount": {"$gte": 1000}, "currency": {"$in": ["EUR", "USD"]}}})
    tagged = _endpoint(api, filter={"data": {"tags": "vip"}, "type": {"$startsWith": "invoice."}})
    nested = _endpoint(api, filter={"data": {"customer": {"country": {"$neq": "FR"}}}})
    either = _endpoint(api, filter={"$or": [{"channels": "eu"}, {"data": {"rush": {"$exists": True}}}]})
    negated = _endpoint(api, filter={"$not": {"data": {"amount": {"$lt": 10}}}})
    everything = _endpoint(api)
    big, tagged, nested, either, negated, everything = (endpoint["id"] for endpoint in
                                                        (big, tagged, nested, either, negated, everything))
    cases = [
        ({"amount": 1500, "currency": "EUR", "tags": ["vip", "x"], "customer": {"country": "DE"}}, [],
         {big, tagged, nested, negated, everything}),
        ({"amount": 999, "currency": "EUR", "customer": {"country": "FR"}}, ["eu"], {either, negated, everything}),
        ({"amount": "1500", "currency": "EUR", "rush": None}, [], {nested, either, negated, everything}),
        ({"amount": 5}, [], {nested, everything}),
    ]
    for data, channels, wanted in cases:
        event = api.send_event("invoice.paid", data, channels=channels)
        assert _delivered_to(event) == wanted, data


def test_a_filter_is_echoed_patched_and_removed(api):
    endpoint = _endpoint(api, filter={"type": "invoice.paid"})
    assert endpoint["filter"] == {"type": "invoice.paid"}
    assert _delivered_to(api.send_event("invoice.void", {})) == set()
    patched = api.patch(f"endpoints/{endpoint['id']}", {"filter": {"type": "invoice.void"}})
    assert patched.status_code == 200 and patched.json()["filter"] == {"type": "invoice.void"}
    assert _delivered_to(api.send_event("invoice.void", {})) == {endpoint["id"]}
    assert api.patch(f"endpoints/{endpoint['id']}", {"filter": None}).json()["filter"] is None
    assert _delivered_to(api.send_event("invoice.paid", {})) == {endpoint["id"]}
    assert Endpoint.objects.get(pk=endpoint["id"]).filter_path is None


@pytest.mark.parametrize(("body", "pointer"), [
    ({"data": {"amount": {"$gt": True}}}, "/filter/data/amount/$gt"),
    ({"data": {"amount": {"$between": [1, 2]}}}, "/filter/data/amount/$between"),
    ({"tenant_id": "tn_other"}, "/filter/tenant_id"),
    ({"data": {"x": [1, 2]}}, "/filter/data/x"),
    ({"data": {"x": {"$in": [1, {"a": 1}]}}}, "/filter/data/x/$in/1"),
    ({"$or": []}, "/filter/$or"),
    ({"data": {"a/b~c": {"$exists": 1}}}, "/filter/data/a~1b~0c/$exists"),
    ([1, 2], "/filter"),
    ("type", "/filter"),
    ({"data": {"x": "y" * 5000}}, "/filter"),
])
def test_an_invalid_filter_is_400_with_the_offending_path_and_changes_nothing(api, body, pointer):
    endpoint = _endpoint(api)
    for response in (api.post("endpoints", {"url": "https://hooks.example.com/y", "filter": body}),
                     api.patch(f"endpoints/{endpoint['id']}", {"filter": body})):
        assert response.status_code == 400, response.content
        problem = response.json()
        assert response["Content-Type"] == "application/problem+json"
        assert problem["code"] == "validation_error" and list(problem["errors"]) == [pointer], problem
    assert Endpoint.objects.get(pk=endpoint["id"]).filter is None


@pytest.mark.parametrize("negated", [{"$not": {"$neq": 1}}, {"$nin": []}, {"$not": {"$exists": False}},
                                     {"$not": {"$not": {"$nin": [1]}}}])
def test_negations_of_negations_are_valid_jsonpath(api, negated):
    # `!!exists(…)` is a jsonpath syntax error: the endpoint's row could not be written (a 500, found by the
    # differential fuzz below)
    response = api.post("endpoints", {"url": "https://hooks.example.com/n", "filter": {"data": {"x": negated}}})
    assert response.status_code == 201, response.content


def test_a_string_jsonpath_cannot_carry_is_refused_at_compile_time():
    # (the API refuses U+0000 in any body before a view sees it: intake/body.py)
    with pytest.raises(filters.FilterInvalid) as refused:
        filters.filter_compile({"data": {"s": "nul\u0000"}})
    assert refused.value.pointer == "/data/s"


def test_filters_are_bounded_in_depth_and_size(api):
    deep: dict = {"type": "x"}
    for _ in range(50):
        deep = {"$not": deep}
    response = api.post("endpoints", {"url": "https://hooks.example.com/y", "filter": deep})
    assert response.status_code == 400 and "nests at most" in json.dumps(response.json())
    wide = {"data": {"x": {"$in": list(range(filters.FILTER_MAX_LIST + 1))}}}
    assert api.post("endpoints", {"url": "https://hooks.example.com/y", "filter": wide}).status_code == 400


def test_a_filter_sees_only_its_own_tenants_event(api, other_api):
    # A filter matches the document of the event being fanned out, and only its tenant's endpoints are
    # considered: another tenant's events never reach it, whatever it asks for.
    mine = _endpoint(api, filter={"$or": [{"type": {"$exists": True}}, {"$not": {"type": {"$exists": True}}}]})
    event = other_api.send_event("invoice.paid", {"secret": "theirs"})
    assert mine["id"] not in _delivered_to(event)
    assert _delivered_to(api.send_event("invoice.paid", {})) == {mine["id"]}


# --- fuzz ----------------------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
_keys = st.one_of(st.sampled_from(["type", "data", "channels", "amount", "tags", "a", "$eq", "$neq", "$in",
                                   "$nin", "$gt", "$gte", "$lt", "$lte", "$exists", "$startsWith", "$and",
                                   "$or", "$not", "$nope"]), st.text(max_size=6))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(_keys, inner, max_size=4)), max_leaves=20)
_docs = st.fixed_dictionaries({
    "type": st.sampled_from(["invoice.paid", "a.b"]),
    "data": st.dictionaries(st.sampled_from(["amount", "tags", "a", "type"]), _json.filter(
        lambda v: "\\u0000" not in json.dumps(v) and "NaN" not in json.dumps(v) and "Infinity" not in json.dumps(v)),
        max_size=4),
    "channels": st.lists(st.sampled_from(["eu", "us"]), max_size=2)})


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(candidate=st.dictionaries(_keys, _json, max_size=4), docs=st.lists(_docs, min_size=1, max_size=3))
def test_fuzz_a_filter_compiles_or_is_refused_and_postgres_always_evaluates_it(candidate, docs):
    try:
        path = filters.filter_compile(candidate)
    except filters.FilterInvalid as exc:
        assert exc.pointer == "" or exc.pointer.startswith("/")
        return
    with connection.cursor() as cursor:
        for doc in docs:
            cursor.execute("SELECT coalesce(%s::jsonb @@ %s::jsonpath, false)", [json.dumps(doc), path])
            assert cursor.fetchone()[0] in (True, False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(candidate=_json)
def test_fuzz_the_api_answers_a_filter_with_201_or_400_never_500(api, candidate):
    try:
        body = json.dumps({"url": "https://hooks.example.com/f", "filter": candidate}, allow_nan=False)
    except ValueError:
        return
    response = api.post("endpoints", raw=body.encode())
    assert response.status_code in (201, 400), response.content
    if response.status_code == 201:  # and intake, matching it, answers 202
        event = api.send_event("invoice.paid", {"amount": 1, "tags": ["a"], "a": {"b": "c"}})
        assert event["id"].startswith("evt_")
        api.delete(f"endpoints/{response.json()['id']}")


# A reference of the documented semantics (docs/api.md), to check PostgreSQL's evaluation of what
# filters.py compiles against: fields by nesting, arrays unwrapped one level at each step and two at the
# compared value (jsonpath's lax mode), a comparison between different types never holds.

def _values(doc, keys):
    found = [doc]
    for key in keys:
        step = []
        for item in found:
            for inner in (item if isinstance(item, list) else [item]):
                if isinstance(inner, dict) and key in inner:
                    step.append(inner[key])
        found = step
    return found


def _kind(value):
    return "bool" if isinstance(value, bool) else "num" if isinstance(value, (int, float)) else \
        "null" if value is None else "str" if isinstance(value, str) else "other"


def _unwrapped(value):
    # lax mode unwraps an array once as the filter's item, and once more as the comparison's operand
    for item in (value if isinstance(value, list) else [value]):
        yield from (item if isinstance(item, list) else [item])


def _compare(found, op, wanted):
    for value in found:
        for item in _unwrapped(value):
            if _kind(item) != _kind(wanted) or _kind(item) == "other":
                continue
            if op == "==" and item == wanted:
                return True
            if op == "starts":
                if item.startswith(wanted):
                    return True
                continue
            if op != "==" and _kind(item) in ("num", "str") and {
                    ">": item > wanted, ">=": item >= wanted, "<": item < wanted, "<=": item <= wanted}[op]:
                return True
    return False


def _matches(condition, doc, keys=()):
    results = []
    for key, sub in condition.items():
        found = _values(doc, keys) if key.startswith("$") else None
        if key == "$and":
            results.append(all(_matches(c, doc, keys) for c in sub))
        elif key == "$or":
            results.append(any(_matches(c, doc, keys) for c in sub))
        elif key == "$not":
            results.append(not _matches(sub, doc, keys))
        elif key in filters.COMPARISONS:
            op = filters.COMPARISONS[key]
            results.append(not _compare(found, "==", sub) if op == "!=" else _compare(found, op, sub))
        elif key in ("$in", "$nin"):
            hit = any(_compare(found, "==", v) for v in sub)
            results.append(hit if key == "$in" else not hit)
        elif key == "$exists":
            results.append(bool(found) == sub)
        elif key == "$startsWith":
            results.append(_compare(found, "starts", sub))
        elif isinstance(sub, dict):
            results.append(_matches(sub, doc, (*keys, key)))
        else:
            results.append(_compare(_values(doc, (*keys, key)), "==", sub))
    return all(results)


_words = st.sampled_from(["a", "b", "ab", "ba", "é", ""])
_plain = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.5, -0.5]), _words)
_ordered = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", "ab"]))
_fields = st.sampled_from(["x", "y", "z"])


def _operators(conditions):
    return st.one_of(
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$eq", "$neq"]), _plain),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), _ordered),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$in", "$nin"]), st.lists(_plain, max_size=3)),
        st.builds(lambda v: {"$exists": v}, st.booleans()),
        st.builds(lambda v: {"$startsWith": v}, _words),
        st.builds(lambda v: {"$not": v}, conditions),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$and", "$or"]), st.lists(conditions, min_size=1, max_size=2)),
    )


_conditions = st.recursive(
    st.one_of(_plain, st.just({})),
    lambda inner: st.one_of(_operators(st.dictionaries(_fields, inner, min_size=1, max_size=2)),
                            st.dictionaries(_fields, inner, min_size=1, max_size=2)),
    max_leaves=6)
_data_values = st.recursive(_plain, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(_fields, inner, max_size=3)),
                            max_leaves=8)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(condition=st.dictionaries(_fields, _conditions, min_size=1, max_size=2),
       data=st.lists(st.dictionaries(_fields, _data_values, max_size=3), min_size=1, max_size=4))
def test_fuzz_postgres_matches_as_the_documented_semantics_say(condition, data):
    the_filter = {"data": condition}
    try:
        path = filters.filter_compile(the_filter)
    except filters.FilterInvalid:
        return  # (a plain {} under a field with nothing to nest, say: refused, and that is all)
    with connection.cursor() as cursor:
        for one in data:
            doc = {"type": "a.b", "data": one, "channels": []}
            cursor.execute("SELECT coalesce(%s::jsonb @@ %s::jsonpath, false)", [json.dumps(doc), path])
            assert cursor.fetchone()[0] == _matches(the_filter, doc), (the_filter, doc, path)
