"""Catalog schemas' regular expressions run on RE2, in linear time (SPEC §12): a pattern that makes Python's
`re` backtrack for ever answers at once through real gunicorn, a pattern RE2 will not take is refused
when the type is written (with its pointer), schemas are bounded in size and depth, and nothing a tenant
or the platform sends makes the check fail with a 500."""
import json
import time
import uuid

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.processes import free_port, gunicorn, warm
# the catalog's fixtures: a platform credential, and the compiled validators emptied around each test
from tests.test_event_types_api import _fresh_validators, make_platform_api, platform  # noqa: F401
from webhooks import event_schemas, linear_regex
from webhooks.models import EventType

pytestmark = pytest.mark.django_db(transaction=True)

ATTACK = "^(a+)+$"
ATTACK_TEXT = "a" * 40 + "!"   # Python's re: 2^40 steps, holding the GIL


# Every keyword through which jsonschema matches a pattern against data, with data that would backtrack.
ATTACKS = {
    "pattern": ({"type": "object", "properties": {"code": {"type": "string", "pattern": ATTACK}}},
                {"code": ATTACK_TEXT}, "/data/code"),
    "patternProperties": ({"type": "object", "patternProperties": {ATTACK: {"type": "integer"}}},
                          {ATTACK_TEXT: 1, "aaaa": "not an integer"}, "/data/aaaa"),
    "additionalProperties": ({"type": "object", "patternProperties": {ATTACK: {}}, "additionalProperties": False},
                             {ATTACK_TEXT: 1}, "/data"),
    "unevaluatedProperties": ({"type": "object", "patternProperties": {ATTACK: {}}, "unevaluatedProperties": False},
                              {ATTACK_TEXT: 1}, "/data"),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": ATTACK}}, {ATTACK_TEXT: 1}, "/data"),
}


@pytest.mark.slow
def test_a_backtracking_pattern_answers_400_at_once_and_the_worker_serves_on(platform, api):
    server = warm(gunicorn(free_port(), workers=1, threads=2))
    try:
        for keyword, (schema, data, pointer) in ATTACKS.items():
            name = f"attack.{keyword.lower()}"
            created = requests.post(f"{server.url}/api/v1/event-types", json={"name": name, "schema": schema},
                                    headers={"Authorization": f"Bearer {platform.token}",
                                             "Idempotency-Key": str(uuid.uuid4())}, timeout=10)
            assert created.status_code == 201, created.text
            started = time.monotonic()
            response = requests.post(f"{server.url}/api/v1/events", json={"type": name, "data": data}, timeout=10,
                                     headers={"Authorization": f"Bearer {api.token}",
                                              "Idempotency-Key": str(uuid.uuid4())})
            elapsed = time.monotonic() - started
            assert response.status_code == 400, (keyword, response.text)
            problem = response.json()
            assert problem["code"] == "validation_error" and pointer in problem["errors"], (keyword, problem)
            # SPEC's target is 50 ms on an idle machine; this shared one gets a second (Python's re: hours)
            assert elapsed < 1.0, (keyword, elapsed)
        assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(("schema", "pointer"), [
    ({"type": "string", "pattern": "(a)\\1"}, "/schema/pattern"),                          # a backreference
    ({"type": "string", "pattern": "^(?=a)a"}, "/schema/pattern"),                         # lookahead
    ({"properties": {"x": {"pattern": "(?<!a)b"}}}, "/schema/properties/x/pattern"),       # lookbehind
    ({"patternProperties": {"(?=x)": {}}}, "/schema/patternProperties"),
    ({"propertyNames": {"pattern": "(a)\\1"}}, "/schema/propertyNames/pattern"),
    ({"pattern": "x" * (linear_regex.MAX_PATTERN_CHARS + 1)}, "/schema/pattern"),
    ({"pattern": ".{1000}x"}, "/schema/pattern"),                                           # too large a program
    ({"$defs": {"code": {"pattern": "(?=x)"}}}, "/schema/$defs/code/pattern"),
])
def test_a_pattern_re2_refuses_is_a_400_with_its_pointer_at_create_and_at_change(platform, schema, pointer):
    response = platform.post("event-types", {"name": "invoice.paid", "schema": schema})
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "validation_error" and list(problem["errors"]) == [pointer], problem
    assert not EventType.objects.exists()
    assert platform.post("event-types", {"name": "invoice.paid", "schema": {"type": "object"}}).status_code == 201
    response = platform.patch("event-types/invoice.paid", {"schema": schema})
    assert response.status_code == 400 and list(response.json()["errors"]) == [pointer]
    assert EventType.objects.get().schema == {"type": "object"}


def test_patterns_re2_takes_work_as_before(platform, api):
    schema = {"type": "object", "properties": {
        "invoice": {"type": "string", "pattern": "^in_[A-Za-z0-9]+$"},
        "id": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        "name": {"type": "string", "pattern": "^\\p{L}+$"}},
        "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    assert platform.post("event-types", {"name": "invoice.paid", "schema": schema}).status_code == 201
    good = {"invoice": "in_1", "id": str(uuid.uuid4()), "name": "Zoë", "x-note": "ok"}
    assert api.post("events", {"type": "invoice.paid", "data": good}).status_code == 202
    response = api.post("events", {"type": "invoice.paid", "data": {"invoice": "inv", "name": "R2D2", "x-n": 1,
                                                                   "other": 1}})
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"/data/invoice", "/data/name", "/data/x-n", "/data"}


def test_schemas_are_bounded_in_depth_and_size(platform):
    deep: dict = {}
    node = deep
    for _ in range(event_schemas.MAX_SCHEMA_DEPTH):
        node["not"] = {}
        node = node["not"]
    response = platform.post("event-types", {"name": "a.b", "schema": deep})
    assert response.status_code == 400 and response.json()["errors"], response.content
    pointer, = response.json()["errors"]
    assert pointer.startswith("/schema/not/not/") and "nested too deeply" in response.json()["errors"][pointer][0]
    big = {"enum": ["x" * 1000 for _ in range(event_schemas.MAX_SCHEMA_BYTES // 1000 + 1)]}
    response = platform.post("event-types", {"name": "a.b", "schema": big})
    assert response.status_code == 400 and list(response.json()["errors"]) == ["/schema"]
    assert not EventType.objects.exists()
    # just within both bounds is taken
    shallow: dict = {}
    node = shallow
    for _ in range(event_schemas.MAX_SCHEMA_DEPTH // 2 - 1):
        node["not"] = {"not": {}}
        node = node["not"]["not"]
    assert platform.post("event-types", {"name": "a.b", "schema": shallow}).status_code == 201


def test_a_stored_schema_with_a_pattern_re2_refuses_answers_400_not_500(api):
    # written before patterns were checked by RE2 (or by hand): events of its type are refused, clearly
    schema = {"type": "string", "pattern": "(a)\\1"}
    EventType.objects.create(name="legacy.kind", schema=schema, schema_digest=event_schemas.schema_digest(schema))
    response = api.post("events", {"type": "legacy.kind", "data": "aa"})
    assert response.status_code == 400, response.content
    problem = response.json()
    assert problem["code"] == "validation_error" and "RE2" in problem["errors"]["/data"][0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.text(max_size=60) | st.from_regex(r"[\^$()|*+?{}\[\]a.\\dws0-9,]{0,30}", fullmatch=True),
       text=st.text(max_size=200))
def test_any_pattern_is_refused_clearly_or_matched_quickly(pattern, text):
    """The checks themselves, fuzzed: whatever the platform writes as a pattern, writing it is a
    SchemaInvalid keyed by pointer or a validator; whatever a tenant's string, checking it returns errors
    keyed by pointer, quickly."""
    schema = {"type": "object", "properties": {"s": {"pattern": pattern}}, "patternProperties": {pattern: {}},
              "additionalProperties": {"type": "integer"}}
    try:
        validator = event_schemas.schema_check(schema)
    except event_schemas.SchemaInvalid as exc:
        assert exc.errors and all(key.startswith("/schema") for key in exc.errors), exc.errors
        return
    started = time.thread_time()   # CPU time of this thread: a busy machine's stalls do not count, backtracking does
    errors = event_schemas.instance_errors(validator, {"s": text, text: text}, pointer="/data")
    assert time.thread_time() - started < 0.5
    assert all(key.startswith("/data") for key in errors)
    json.dumps(errors)


@settings(max_examples=100, deadline=None)
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=50),
                         lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                                     max_size=5),
                         max_leaves=30))
def test_any_json_as_a_schema_is_a_validator_or_a_keyed_refusal(body):
    try:
        event_schemas.schema_check(body)
    except event_schemas.SchemaInvalid as exc:
        assert exc.errors and all(key.startswith("/schema") for key in exc.errors)


@settings(max_examples=500, deadline=None)
@given(pattern=st.from_regex(r"\^?([a-zé.]|\\d|\\w|\\s|\[[a-z0-9é-]{1,4}\]|\(\?:[a-z|]{1,4}\))[*+?]?"
                             r"([a-zé.]|\\d|\[^a\])?\$?", fullmatch=True),
       text=st.text(alphabet=st.sampled_from("aébz09 _.\n\u20ac\U0001f600"), max_size=12))
def test_the_search_says_what_re2s_own_search_says(pattern, text):
    """linear_regex.search asks RE2's program directly rather than through google-re2's `search` (which maps
    offsets back to characters for a match object nobody reads): the same answer, on non-ASCII text too."""
    from hypothesis import reject

    from webhooks import linear_regex

    try:
        program = linear_regex.compiled(pattern)
    except linear_regex.PatternRefused:   # e.g. "[0--]": refused when written, never searched
        reject()
    assert linear_regex.search(pattern, text) is (program.search(text) is not None)
