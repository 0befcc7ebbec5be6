"""The event-type catalog (SPEC §12): written by the platform credential, read by every credential, and its
JSON Schemas checked at intake with errors keyed by JSON pointer."""
import json
import threading

import pytest
from django.db import connection, connections

from testkit.local_server import LocalServer, QuietHandler
from tests.conftest import Api
from tests.fuzzing import ENV, SEED
from webhooks import event_schemas
from webhooks.models import Delivery, DeliveryOutbox, Event, EventType

pytestmark = pytest.mark.django_db(transaction=True)

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "invoice": {"type": "string", "pattern": "^in_"},
        "amount": {"type": "integer", "minimum": 0},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}},
                                             "required": ["sku"]}},
    },
    "required": ["invoice", "amount"],
}


def make_platform_api() -> Api:
    """A platform credential (SPEC §10), as `create_credential --platform` makes it."""
    from intake.credentials import credential_create_platform

    credential, token = credential_create_platform(name="the-platform")
    return Api(token, credential)


@pytest.fixture
def platform(db):
    return make_platform_api()


@pytest.fixture(autouse=True)
def _fresh_validators():
    event_schemas.cache_clear()
    yield
    event_schemas.cache_clear()


def _create(platform, **body):
    response = platform.post("event-types", body)
    assert response.status_code == 201, response.content
    return response.json()


def test_the_platform_creates_reads_changes_and_deletes_a_type(platform):
    created = _create(platform, name="invoice.paid", description="An invoice was paid.", schema=INVOICE_SCHEMA,
                      example={"invoice": "in_1", "amount": 1200})
    assert created["id"].startswith("etype_")
    assert {k: created[k] for k in ("name", "description", "schema", "example")} == {
        "name": "invoice.paid", "description": "An invoice was paid.", "schema": INVOICE_SCHEMA,
        "example": {"invoice": "in_1", "amount": 1200}}

    assert platform.get("event-types/invoice.paid").json() == created

    changed = platform.patch("event-types/invoice.paid", {"description": "Paid in full."})
    assert changed.status_code == 200
    assert changed.json()["description"] == "Paid in full."
    assert changed.json()["schema"] == INVOICE_SCHEMA  # what was not sent is kept

    assert platform.patch("event-types/invoice.paid", {"schema": None, "example": "anything"}).json()["schema"] is None

    assert platform.delete("event-types/invoice.paid").status_code == 204
    assert platform.get("event-types/invoice.paid").status_code == 404
    assert not EventType.objects.exists()


def test_every_credential_reads_the_list_only_the_platform_writes(platform, api):
    _create(platform, name="invoice.paid")
    _create(platform, name="customer.created", description="A customer signed up.")

    listed = api.get("event-types")
    assert listed.status_code == 200
    assert [t["name"] for t in listed.json()["data"]] == ["customer.created", "invoice.paid"]  # newest first

    for response in (api.post("event-types", {"name": "order.placed"}),
                     api.get("event-types/invoice.paid"),
                     api.patch("event-types/invoice.paid", {"description": "mine now"}),
                     api.delete("event-types/invoice.paid")):
        assert response.status_code == 403, response.content
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "forbidden"
    assert sorted(EventType.objects.values_list("name", "description")) == [
        ("customer.created", "A customer signed up."), ("invoice.paid", "")]

    anonymous = Api("hrld_not-a-token", api.credential)
    assert anonymous.get("event-types").status_code == 401
    assert anonymous.post("event-types", {"name": "order.placed"}).status_code == 401


def test_the_list_is_cursor_paginated(platform):
    for n in range(5):
        _create(platform, name=f"thing.t{n}")
    first = platform.get("event-types", limit=3).json()
    assert [t["name"] for t in first["data"]] == ["thing.t4", "thing.t3", "thing.t2"]
    rest = platform.get("event-types", limit=3, cursor=first["next_cursor"]).json()
    assert [t["name"] for t in rest["data"]] == ["thing.t1", "thing.t0"]
    assert rest["next_cursor"] is None


def test_a_second_type_of_the_same_name_is_a_conflict(platform):
    _create(platform, name="invoice.paid")
    response = platform.post("event-types", {"name": "invoice.paid", "description": "again"})
    assert response.status_code == 409
    assert response.json()["code"] == "conflict"
    assert EventType.objects.get().description == ""


def test_two_creates_of_one_name_at_the_same_moment_make_one_type(platform):
    barrier = threading.Barrier(4)
    statuses = []

    def create(n):
        try:
            barrier.wait()
            statuses.append(platform.post("event-types", {"name": "race.won", "description": f"#{n}"}).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [201, 409, 409, 409]
    assert EventType.objects.filter(name="race.won").count() == 1


def test_the_idempotency_rules_apply(platform):
    body = {"name": "invoice.paid", "description": "once"}
    first = platform.post("event-types", body, key="catalog-key-1")
    again = platform.post("event-types", body, key="catalog-key-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replay"] == "true"
    assert again.content == first.content
    assert platform.post("event-types", body, key=None).json()["code"] == "idempotency_key_missing"
    assert platform.post("event-types", {"name": "other.type"}, key="catalog-key-1").json()["code"] == \
        "idempotency_key_reused"
    assert EventType.objects.count() == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "not a type"}, "name"),
    ({"name": "herald.endpoint.tripped"}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"description": "no name"}, "name"),
    ({"name": "a.b", "description": "d" * 2001}, "description"),
    ({"name": "a.b", "schema": {"type": "no-such-type"}}, "/schema/type"),
    ({"name": "a.b", "schema": {"properties": {"amount": {"minimum": "zero"}}}}, "/schema/properties/amount/minimum"),
    ({"name": "a.b", "schema": {"type": "string", "pattern": "(unclosed"}}, "/schema/pattern"),
    ({"name": "a.b", "schema": ["not", "an", "object"]}, "/schema"),
    ({"name": "a.b", "schema": True}, "/schema"),
    ({"name": "a.b", "schema": {"$schema": "http://json-schema.org/draft-07/schema#"}}, "/schema/$schema"),
    ({"name": "a.b", "schema": {"$ref": "#/$defs/missing"}}, "/schema/$ref"),
    ({"name": "a.b", "schema": {"$ref": "https://example.com/remote.json"}}, "/schema/$ref"),
    ({"name": "a.b", "schema": INVOICE_SCHEMA, "example": {"invoice": "in_1", "amount": -1}}, "/example/amount"),
    ({"name": "a.b", "schema": INVOICE_SCHEMA, "example": {"invoice": "in_1"}}, "/example/amount"),
])
def test_an_invalid_type_is_refused_with_the_field_or_pointer_and_nothing_stored(platform, body, field):
    response = platform.post("event-types", body)
    assert response.status_code == 400, response.content
    problem = response.json()
    assert response["Content-Type"] == "application/problem+json"
    assert problem["code"] == "validation_error"
    assert field in problem["errors"], problem
    assert not EventType.objects.exists()


def test_a_new_schema_that_the_kept_example_does_not_match_is_refused(platform):
    _create(platform, name="invoice.paid", schema=INVOICE_SCHEMA, example={"invoice": "in_1", "amount": 5})
    stricter = {**INVOICE_SCHEMA, "properties": {**INVOICE_SCHEMA["properties"],
                                                 "amount": {"type": "integer", "minimum": 100}}}
    response = platform.patch("event-types/invoice.paid", {"schema": stricter})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["/example/amount"]
    assert EventType.objects.get().schema == INVOICE_SCHEMA


def test_malformed_and_odd_bodies_are_400_never_500(platform):
    for raw in ("{", "[]", '"name"', '{"name": ["a.b"]}', '{"name": "a.b", "schema": {"type": "integer", "maximum": 1e400}}',
                '{"name": "a.b", "schema": ' + "[" * 5000 + "]" * 5000 + "}",
                '{"name": "a.b", "schema": ' + '{"items":' * 3000 + "{}" + "}" * 3000 + "}"):
        response = platform.post("event-types", raw=raw)
        assert 400 <= response.status_code < 500, (raw[:60], response.status_code, response.content[:300])
        assert response["Content-Type"] == "application/problem+json"
    assert platform.patch("event-types/nope.none", {"description": "x"}).status_code == 404
    assert not EventType.objects.exists()


def test_a_schemad_type_refuses_bad_data_with_pointers_and_keeps_nothing(platform, api):
    api.post("endpoints", {"url": "https://receiver.example.com/"})
    _create(platform, name="invoice.paid", schema=INVOICE_SCHEMA)

    response = api.post("events", {"type": "invoice.paid", "data": {
        "invoice": "inv_1", "amount": "12.00", "lines": [{"sku": "a"}, {"qty": 1}], "extra/field~x": True}})

    assert response.status_code == 400, response.content
    problem = response.json()
    assert problem["code"] == "validation_error"
    assert set(problem["errors"]) == {"/data/invoice", "/data/amount", "/data/lines/1/sku"}
    assert "is not of type 'integer'" in problem["errors"]["/data/amount"][0]
    assert problem["errors"]["/data/lines/1/sku"] == ["This property is required."]
    assert not Event.objects.exists()
    assert not Delivery.objects.exists()
    assert not DeliveryOutbox.objects.exists()

    missing = api.post("events", {"type": "invoice.paid", "data": {}}).json()["errors"]
    assert set(missing) == {"/data/invoice", "/data/amount"}
    assert api.post("events", {"type": "invoice.paid", "data": "a string"}).json()["errors"] == {
        "/data": ["'a string' is not of type 'object'"]}

    good = api.post("events", {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 1200,
                                                                "lines": [{"sku": "a"}]}})
    assert good.status_code == 202, good.content
    assert len(good.json()["deliveries"]) == 1
    assert Event.objects.count() == 1


def test_types_outside_the_catalog_or_without_a_schema_are_accepted_as_before(platform, api):
    _create(platform, name="note.added", description="No schema.")
    for event_type in ("note.added", "never.listed"):
        assert api.post("events", {"type": event_type, "data": ["anything", 1, None]}).status_code == 202
    assert Event.objects.count() == 2


def test_a_refused_event_answer_is_replayed_and_its_key_never_executes_again(platform, api):
    _create(platform, name="invoice.paid", schema=INVOICE_SCHEMA)
    body = {"type": "invoice.paid", "data": {"invoice": "in_1"}}
    first = api.post("events", body, key="bad-data-key")
    again = api.post("events", body, key="bad-data-key")
    assert first.status_code == again.status_code == 400
    assert again["Idempotent-Replay"] == "true"
    assert not Event.objects.exists()


def test_a_changed_schema_is_used_by_every_process_from_its_next_event(platform, api):
    """The validator this process compiled is keyed by the schema's digest, read in the ingest statement:
    a change made elsewhere (here: straight in the database, as another process's PATCH would) is seen."""
    _create(platform, name="invoice.paid", schema=INVOICE_SCHEMA)
    body = {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 5}}
    assert api.post("events", body).status_code == 202  # compiled and held now

    stricter = {**INVOICE_SCHEMA, "properties": {**INVOICE_SCHEMA["properties"],
                                                 "amount": {"type": "integer", "minimum": 100}}}
    EventType.objects.filter(name="invoice.paid").update(schema=stricter,
                                                         schema_digest=event_schemas.schema_digest(stricter))
    refused = api.post("events", body)
    assert refused.status_code == 400
    assert list(refused.json()["errors"]) == ["/data/amount"]

    EventType.objects.filter(name="invoice.paid").delete()
    assert api.post("events", body).status_code == 202


@pytest.mark.parametrize("fast", [False, True], ids=["general path", "fast path"])
def test_the_held_validator_saves_reading_the_schema_again(platform, api, settings, fast):
    settings.INTAKE_FAST_PATH = fast  # intake/idempotency/fast_events.py: the same digest, as its function's argument
    _create(platform, name="invoice.paid", schema=INVOICE_SCHEMA)
    body = {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 5}}
    known = []

    def spy(execute, sql, params, many, context):
        if "INSERT INTO webhooks_event " in sql:
            known.append(params["known_digest"])
        if "herald_event_intake" in sql:
            known.append(params[12])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        assert api.post("events", body).status_code == 202
        assert api.post("events", body).status_code == 202
    digest = event_schemas.schema_digest(INVOICE_SCHEMA)
    # the first statement sends the schema (nothing held); the second only if its digest is not this one.
    # The fast path's function answers a digest it was not given with the schema and does nothing; the data
    # is checked, and the second call goes with the digest.
    assert known == ([None, digest, digest] if fast else [None, digest])


def test_deeply_nested_data_of_a_schemad_type_is_a_400_not_a_500(platform, api):
    _create(platform, name="tree.grown", schema={"$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                                                 "$ref": "#/$defs/node"})
    for depth in (10, 400, 2000):
        raw = json.dumps({"type": "tree.grown", "data": "PLACEHOLDER"}).replace('"PLACEHOLDER"',
                                                                                "[" * depth + "]" * depth)
        response = api.post("events", raw=raw)
        assert response.status_code in (202, 400), (depth, response.status_code, response.content[:200])
        if response.status_code == 400:
            assert response.json()["code"] == "validation_error"
    assert api.post("events", {"type": "tree.grown", "data": [[], [[]]]}).status_code == 202
    assert api.post("events", {"type": "tree.grown", "data": [[], [1]]}).json()["errors"] == {
        "/data/1/0": ["1 is not of type 'array'"]}


def test_a_list_of_many_bad_items_answers_with_a_bounded_list_of_errors(platform, api):
    _create(platform, name="batch.sent", schema={"type": "array", "items": {"type": "integer"}})
    response = api.post("events", {"type": "batch.sent", "data": ["x" * 400] * 500})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert len(errors) == event_schemas.MAX_ERRORS
    assert all(len(message) <= event_schemas.MAX_MESSAGE_CHARS for messages in errors.values() for message in messages)


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_in_the_catalog_written_by_the_platform(platform, tmp_path):
    """Generated names, schemas and examples (any JSON) against the live server, with the platform token."""
    import re
    import subprocess

    from tests.processes import BIN, ROOT, free_port, gunicorn

    _create(platform, name="invoice.paid", schema=INVOICE_SCHEMA)
    server = gunicorn(free_port(), workers=2, threads=4)
    try:
        result = subprocess.run(
            [str(BIN / "st"), "run", f"{server.url}/api/schema/", "--url", server.url,
             "-H", f"Authorization: Bearer {platform.token}", "--include-path-regex", "event-types",
             "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                         "response_schema_conformance",
             # one worker: see tests/test_openapi.py (CPython 3.11.7's `ast` under schemathesis's threads)
             "--max-examples", "60", "--seed", str(SEED), "--workers", "1", "--request-timeout", "20",
             "--phases", "examples,coverage,fuzzing", "--no-color", "--generation-database", "none"],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        server.stop()
    assert result.returncode == 0, (f"replay with {ENV}={SEED}\n" + result.stdout[-6000:] + result.stderr[-2000:]
                                    + server.output()[-3000:])
    generated = re.search(r"(\d+) generated", result.stdout)
    assert generated and int(generated.group(1)) >= 100, result.stdout[-3000:]


def test_a_schema_never_makes_herald_fetch_a_ref(platform, api):
    """jsonschema, left to itself, fetches an unknown `$ref` URL: a schema could make Herald call any address.
    A real local server counts what reaches it, on write and at intake."""
    hits = []

    class Handler(QuietHandler):
        def do_GET(self):
            hits.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = LocalServer(Handler)
    url = f"http://127.0.0.1:{server.port}/schema.json"
    try:
        refused = platform.post("event-types", {"name": "remote.ref", "schema": {
            "type": "object", "properties": {"amount": {"$ref": url}}}})
        assert refused.status_code == 400
        assert list(refused.json()["errors"]) == ["/schema/properties/amount/$ref"]
        # under a subschema with an $id of its own the ref is left to validation time: refused there, not fetched
        _create(platform, name="nested.ref", schema={"type": "object", "properties": {
            "amount": {"$id": "https://schemas.example/amount", "$ref": url}}})
        at_intake = api.post("events", {"type": "nested.ref", "data": {"amount": 5}})
        assert at_intake.status_code == 400 and list(at_intake.json()["errors"]) == ["/data"]
    finally:
        server.close()
    assert hits == []
    assert not Event.objects.exists()
