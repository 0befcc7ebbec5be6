"""A fuzzer over the whole API (SPEC §5: no input is ever a 500): hypothesis sends any method to any route with
ids, paths, query strings, headers and bodies that range from right to absurd (NUL and other control
characters, broken UTF-8 in percent-escapes, over-long segments, numbers JSON cannot carry), through the full
middleware stack in this process, against real PostgreSQL. Every answer must be below 500, and every error an
API answers must be problem+json.

schemathesis covers the same API from its OpenAPI schema, on a live gunicorn (tests/test_openapi.py); this one
reaches what the schema does not describe: paths that match no route, the idempotency layer's own checks, the
portal's and admin's URLs."""
import json
import time
from urllib.parse import quote, urlencode

import pytest
from django.test import Client
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from tests.conftest import create_endpoint, make_api
from tests.fuzzing import ENV, SEED
from tests.test_portal import _portal

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BUDGET_SECONDS = 40
METHODS = ["GET", "POST", "PATCH", "DELETE", "PUT", "HEAD", "OPTIONS"]
ROUTES = ["endpoints", "endpoints/{id}", "endpoints/{id}/secret", "endpoints/{id}/rotate-secret",
          "endpoints/{id}/test", "portal-links", "events", "events/{id}", "deliveries", "deliveries/{id}",
          "deliveries/{id}/retry", "{id}", "{id}/{id}", "endpoints/new", "endpoints/{id}/rotate",
          "deliveries/{id}/resend"]
QUERY_NAMES = ["cursor", "limit", "type", "status", "endpoint", "event", "created_after", "created_before"]

# Text as it arrives in a URL or a form: anything, including NUL and lone surrogates' UTF-8 remains.
wild_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=8),
    st.sampled_from(["", "\x00", "ep_\x00", "..", ".", "%", "%00", "%ff", "%c0%af", "\ud800".encode("utf-8",
                     "surrogatepass").decode("latin-1"), "9" * 400, "x" * 2_100, "1e400", "-1", "0", "NaN",
                     "2026-13-45T99:99:99Z", "🙂"]),
)


def _escaped(text: str) -> str:
    """Percent-encode as a client would (broken UTF-8 sequences survive as their bytes)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | wild_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(wild_text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def requests_(draw, ids: dict[str, list[str]]):
    method = draw(st.sampled_from(METHODS))
    route = draw(st.sampled_from(ROUTES))
    while "{id}" in route:
        kind = draw(st.sampled_from(["real", "wild", "raw"]))
        if kind == "real":
            value = _escaped(draw(st.sampled_from(ids["all"])))
        elif kind == "wild":
            value = _escaped(draw(wild_text))
        else:
            value = draw(st.sampled_from(["%00", "%2e%2e", "a%2Fb", "%ff%fe", "ep_%00x", "%E2%80%AE"]))
        route = route.replace("{id}", value or "x", 1)
    prefix = draw(st.sampled_from(["/api/v1/", "/api/v1/", "/api/v1/", "/portal/", "/api/", "/"]))
    names = draw(st.lists(st.sampled_from(QUERY_NAMES) | wild_text, max_size=3))
    query = urlencode([(name.encode("utf-8", "surrogatepass"),
                        draw(st.sampled_from(ids["all"]) | wild_text).encode("utf-8", "surrogatepass"))
                       for name in names])
    body_kind = draw(st.sampled_from(["none", "json", "shaped", "raw"]))
    if body_kind == "json":
        body = json.dumps(draw(json_values)).encode()
    elif body_kind == "shaped":  # the fields the API knows, with any values
        fields = ["url", "event_types", "channels", "description", "enabled", "max_in_flight", "throttle_rate",
                  "ordering", "type", "data"]
        shaped = draw(st.dictionaries(st.sampled_from(fields), json_values, max_size=6))
        if draw(st.booleans()):
            shaped.setdefault("url", draw(st.sampled_from(["https://hooks.example.com/x", "http://[::1", "https://a@b/",
                                                           "https://h.example/\x00", "https://" + "a" * 2100])))
            shaped.setdefault("type", draw(st.sampled_from(["invoice.paid", "herald.test", "a..b", "x" * 300])))
        body = json.dumps(shaped).encode()
    elif body_kind == "raw":
        body = draw(st.binary(max_size=64) | st.sampled_from([b'{"type": "x", "data": 1e400}', b"{", b"\xff\xfe",
                                                              b'{"a": "\\u0000"}', b"[]", b"null"]))
    else:
        body = b""
    content_type = draw(st.sampled_from(["application/json", "application/json", "text/plain",
                                         "application/json; charset=latin-1", "multipart/form-data; boundary=x",
                                         "application/x-www-form-urlencoded"]))
    headers = {}
    if draw(st.integers(0, 9)):
        headers["Authorization"] = "Bearer {token}"
    else:
        headers["Authorization"] = draw(st.sampled_from(["", "Bearer", "Bearer \x00", "Basic eDp5", "Bearer " + "x" * 300]))
    if draw(st.integers(0, 4)):
        headers["Idempotency-Key"] = draw(st.sampled_from(["{unique}", "{unique}", '"{unique}"', "short", "x" * 300,
                                                           "key\x7fkey-01", "fixed-key-00000001"]))
    if draw(st.booleans()):
        headers["X-Request-Id"] = draw(wild_text)
    return method, prefix + route + (f"?{query}" if query else ""), body, content_type, headers


@pytest.fixture
def world():
    api = make_api("acme")
    other = make_api("globex")
    endpoint = create_endpoint(api, "https://hooks.example.com/a")
    theirs = create_endpoint(other, "https://hooks.example.com/b")
    event = api.send_event("invoice.paid")
    their_event = other.send_event("invoice.paid")
    all_ids = [endpoint["id"], theirs["id"], event["id"], their_event["id"], event["deliveries"][0]["id"],
               their_event["deliveries"][0]["id"]]
    portal = _portal(api)  # a portal session of acme's, for the portal's own URLs
    return api, portal, {"all": all_ids}


def test_no_request_is_ever_answered_with_a_5xx(world):
    api, portal, ids = world
    client = Client(raise_request_exception=False)
    portal.raise_request_exception = False
    deadline = time.monotonic() + BUDGET_SECONDS
    seen = {"sent": 0}
    failures: list[str] = []

    @seed(SEED)  # fresh each run, printed in pytest's header (tests/fuzzing.py)
    @settings(max_examples=3_000, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              derandomize=False, suppress_health_check=list(HealthCheck), print_blob=False)
    @given(request=requests_(ids))
    # The corpus: past findings, tried on every run whatever the seed (docs/testing.md)
    @example(request=("POST", "/api/v1/events", b'{"type": "invoice.paid", "data": {"a": "\\u0000"}}',
                      "application/json", {"Authorization": "Bearer {token}", "Idempotency-Key": "{unique}"}))
    @example(request=("POST", "/api/v1/events", b'{"type": "invoice.paid", "data": {"a": "\\ud800"}}',
                      "application/json", {"Authorization": "Bearer {token}", "Idempotency-Key": "{unique}"}))
    @example(request=("POST", "/api/v1/events", b'{"type": "invoice.paid", "data": {}}',
                      "application/vnd.example+json", {"Authorization": "Bearer {token}",
                                                       "Idempotency-Key": "{unique}"}))
    @example(request=("PATCH", "/api/v1/endpoints/%00", b'{"url": "https://h.example/\x00"}', "application/json",
                      {"Authorization": "Bearer {token}", "Idempotency-Key": "{unique}"}))
    def run(request):
        if time.monotonic() > deadline:
            return
        method, path, body, content_type, headers = request
        seen["sent"] += 1
        values = {name: value.replace("{token}", api.token).replace("{unique}", f"fuzz-{seen['sent']:08d}")
                  for name, value in headers.items()}
        response = (portal if path.startswith("/portal/") else client).generic(
            method, path, body, content_type=content_type, headers=values)
        if response.status_code >= 500:
            failures.append(f"{response.status_code} {method} {path[:200]!r} body={body[:120]!r} "
                            f"headers={values!r}")
        elif (response.status_code >= 400 and path.startswith("/api/v1/") and method != "HEAD"
              and not response.get("Content-Type", "").startswith("application/problem+json")):
            failures.append(f"{response.status_code} as {response.get('Content-Type')}: {method} {path[:200]!r}")

    run()
    assert seen["sent"] >= 500, seen  # the budget bought a real sample
    assert not failures, f"replay with {ENV}={SEED}\n" + "\n".join(failures[:20])
