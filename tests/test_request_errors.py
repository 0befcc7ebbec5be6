"""Requests rejected before any view runs: problem+json, the stable code, and nothing stored."""
import pytest

from intake.idempotency.keys import InvalidIdempotencyKey, parse_idempotency_key
from intake.models import IdempotencyKey
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {"type": "invoice.paid", "data": {}}


def _assert_problem(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code and body["status"] == status
    assert {"type", "title", "detail"} <= body.keys()


def _nothing_stored():
    return not Event.objects.exists() and not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("key,code", [
    (None, "idempotency_key_missing"),
    ("short", "idempotency_key_invalid"),
    ("", "idempotency_key_invalid"),
    ("x" * 256, "idempotency_key_invalid"),
    ("tab\there-key", "idempotency_key_invalid"),
    ('"unterminated-key', "idempotency_key_invalid"),
    ('"first-key-0001", "second-key-0002"', "idempotency_key_invalid"),
])
def test_bad_keys_are_400_and_nothing_runs(api, key, code):
    response = api.post("events", EVENT, key=key)
    _assert_problem(response, 400, code)
    assert _nothing_stored()


def test_non_printable_keys_are_refused():
    for raw in ("abc\x00defgh", "abc\x7fdefgh", "clé-unicode-key"):
        with pytest.raises(InvalidIdempotencyKey):
            parse_idempotency_key(raw)
    assert parse_idempotency_key("x" * 255) == "x" * 255
    assert parse_idempotency_key('"quoted \\"key\\" 1"') == 'quoted "key" 1'


def test_after_a_rejected_request_the_corrected_retry_with_the_same_key_executes(api):
    _assert_problem(api.post("events", raw="{oops", key="corrected-0001"), 400, "validation_error")
    assert api.post("events", EVENT, key="corrected-0001").status_code == 202


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic dXNlcjpwYXNz", "Bearer "])
def test_missing_or_wrong_token_is_401(api, header):
    client = api.client
    headers = {"Idempotency-Key": "token-check-0001"}
    if header is not None:
        headers["Authorization"] = header
    post = client.post("/api/v1/events", EVENT, content_type="application/json", headers=headers)
    _assert_problem(post, 401, "not_authenticated")
    get = client.get("/api/v1/events", headers={k: v for k, v in headers.items() if k == "Authorization"})
    _assert_problem(get, 401, "not_authenticated")
    assert _nothing_stored()


@pytest.mark.parametrize("raw", ["{oops", '{"type": "a.b", "data": NaN}', "\xff\xfe", '{"type": "a.b"',
                                 '{"type": "a.b", "data": {"k": "\\ud800"}}', '{"type": "a.b", "data": {"\\u0000": 1}}',
                                 '{"type": "a.b", "data": ' + "[" * 5000 + "]" * 5000 + "}"])
def test_malformed_json_is_400_never_500(api, raw):
    _assert_problem(api.post("events", raw=raw), 400, "validation_error")
    assert _nothing_stored()


def test_oversize_body_is_413(api, settings):
    settings.INTAKE_MAX_BODY_BYTES = 1024
    big = {"type": "a.b", "data": {"blob": "x" * 2000}}
    _assert_problem(api.post("events", big), 413, "payload_too_large")
    assert _nothing_stored()
    assert api.post("events", {"type": "a.b", "data": {"blob": "x" * 100}}).status_code == 202


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/vnd.herald+json"])
def test_non_json_content_type_is_415(api, content_type):
    response = api.post("events", raw='{"type": "a.b", "data": {}}', content_type=content_type)
    _assert_problem(response, 415, "unsupported_media_type")
    assert _nothing_stored()


def test_unknown_object_and_wrong_method_use_stable_codes(api):
    _assert_problem(api.get("events/evt_nope"), 404, "not_found")
    _assert_problem(api.client.put("/api/v1/events", "{}", content_type="application/json",
                                   headers={"Authorization": f"Bearer {api.token}"}), 405, "method_not_allowed")


def test_escaped_text_postgres_can_store_is_accepted(api):
    # a surrogate pair (an emoji) and other escapes are fine; only U+0000 and lone surrogates are not
    response = api.post("events", raw='{"type": "a.b", "data": {"smile": "\\ud83d\\ude00", "tab": "\\t"}}')
    assert response.status_code == 202
    assert response.json()["data"] == {"smile": "\U0001F600", "tab": "\t"}


def test_unrouted_paths_and_server_errors_are_problem_json(api, monkeypatch):
    _assert_problem(api.client.get("/api/v1/nope"), 404, "not_found")
    from intake import views

    monkeypatch.setattr(views.EventListCreateView, "get", lambda self, request: 1 / 0)
    _assert_problem(api.get("events"), 500, "server_error")


@pytest.mark.parametrize("method", ["post", "patch"])
@pytest.mark.parametrize("path", ["endpoints/ep_{}/rotate-secret", "endpoints/{}", "no-such-route/{}"])
def test_a_write_to_an_over_long_path_is_a_404_problem_and_nothing_is_stored(api, method, path):
    """A key's row holds paths of up to 2,000 characters (it was a 500); a longer one names no route: ids are
    short."""
    response = getattr(api.client, method)(f"/api/v1/{path.format('x' * 2_500)}", "{}",
                                           content_type="application/json", headers=api._headers("long-0001", None))
    _assert_problem(response, 404, "not_found")
    assert _nothing_stored()


def test_a_nul_in_a_path_or_query_is_refused_before_any_lookup(api):
    """PostgreSQL's text cannot hold U+0000: an id or filter with one was a database error, a 500."""
    from tests.test_portal import _portal

    for response in (api.get("endpoints/ep_%00"), api.get("events/%00"), api.delete("endpoints/%00"),
                     api.post("endpoints/%00/test"), api.post("deliveries/dlv_%00/retry"),
                     api.patch("endpoints/%00", {"enabled": False})):
        _assert_problem(response, 404, "not_found")
    _assert_problem(api.get("events", type="\x00"), 400, "validation_error")
    assert _nothing_stored()
    portal = _portal(api)
    for path in ("/portal/endpoints/%00", "/portal/events/ev%00", "/portal/deliveries/%00"):
        _assert_problem(portal.get(path), 404, "not_found")
    for path in ("/portal/events?type=%00", "/portal/deliveries?type=a%00b"):
        _assert_problem(portal.get(path), 400, "validation_error")
