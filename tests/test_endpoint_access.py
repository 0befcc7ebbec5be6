"""Endpoint headers, auth (basic, bearer, OAuth2 client credentials) and mutual TLS (SPEC §11), end to end:
the API, storage at rest, and attempts to real receivers (a local HTTP receiver, a TLS server that demands a
client certificate from trustme's CA, an OAuth2 token server run by the test)."""
import base64
import datetime as dt
import io
import logging
import time

import pytest
import trustme
from cryptography import x509
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import call_command
from django.db import connection

from tests.access_servers import TlsReceiver, TokenServer
from tests.conftest import create_endpoint
from tests.processes import free_port
from tests.receiver import Answer
from webhooks.delivery.destinations import access
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, EndpointAccess
from webhooks.delivery.claim import deliveries_claim
from webhooks.delivery.engine import delivery_attempt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_tokens")]

HEADER_VALUE = "hv-9f3c1d2e-never-shown"
PASSWORD = "pw-5b7e0a1c-never-shown"
BEARER = "bearer-2d8f4e6a-never-shown"


@pytest.fixture
def token_server():
    server = TokenServer()
    yield server
    server.close()


@pytest.fixture
def ca():
    return trustme.CA()


@pytest.fixture
def ca_bundle(ca, tmp_path, settings):
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    settings.WEBHOOK_CA_BUNDLE = str(path)
    return path


def _client_cert(ca, name="client.herald-test.example") -> dict:
    issued = ca.issue_cert(name)
    return {"certificate": issued.cert_chain_pems[0].bytes().decode(),
            "private_key": issued.private_key_pem.bytes().decode()}


def _attempts(delivery_id):
    return list(DeliveryAttempt.objects.filter(delivery_id=delivery_id).order_by("number"))


def _due_now(delivery_id):
    Delivery.objects.filter(pk=delivery_id).update(next_attempt_at=dt.datetime.now(dt.UTC))


def _stored_text() -> str:
    """Every access column as stored, as one string."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {EndpointAccess._meta.db_table}")
        return repr(cursor.fetchall())


# -- headers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers, fragment", [
    ({"Webhook-Signature": "x"}, "set by Herald"),
    ({"webhook-anything": "x"}, "set by Herald"),
    ({"Content-Type": "text/plain"}, "set by Herald"),
    ({"Authorization": "Bearer x"}, "set by Herald"),
    ({"HOST": "evil"}, "set by Herald"),
    ({"Transfer-Encoding": "chunked"}, "set by Herald"),
    ({"X Bad": "x"}, "[A-Za-z0-9-]"),
    ({"X_Bad": "x"}, "[A-Za-z0-9-]"),
    ({"X-" + "a" * 63: "x"}, "[A-Za-z0-9-]"),
    ({"X-Api-Key": "caf\u00e9"}, "printable ASCII"),
    ({"X-Api-Key": "a\r\nInjected: yes"}, "printable ASCII"),
    ({"X-Api-Key": "a" * 1025}, "printable ASCII"),
    ({"X-Api-Key": 5}, "printable ASCII"),
    ({"X-Api-Key": "a", "x-api-key": "b"}, "twice"),
    ({f"X-H{n}": "v" for n in range(21)}, "At most 20"),
    (["X-Api-Key"], "object"),
])
def test_bad_headers_are_refused_and_change_nothing(api, headers, fragment):
    response = api.post("endpoints", {"url": "https://a.example.com/hook", "headers": headers})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "validation_error" and response["Content-Type"] == "application/problem+json"
    assert fragment in " ".join(body["errors"]["headers"])
    assert not Endpoint.objects.exists() and not EndpointAccess.objects.exists()


@pytest.mark.parametrize("field, value", [
    ("headers", {"X-Api-Key": "k"}),
    ("auth", {"type": "bearer", "token": "t"}),
    ("client_certificate", {"certificate": "x", "private_key": "y"}),
])
def test_a_poll_endpoint_takes_no_headers_auth_or_certificate(api, field, value):
    response = api.post("endpoints", {"kind": "poll", field: value})
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error" and "poll endpoint" in " ".join(response.json()["errors"][field])
    assert not Endpoint.objects.exists() and not EndpointAccess.objects.exists()

    poll = api.post("endpoints", {"kind": "poll", field: None})  # null changes nothing: accepted
    assert poll.status_code == 201, poll.content
    response = api.patch(f"endpoints/{poll.json()['id']}", {field: value})
    assert response.status_code == 400 and field in response.json()["errors"]
    assert not EndpointAccess.objects.exists()


def test_headers_are_stored_encrypted_and_only_their_names_are_shown(api):
    headers = {"X-Api-Key": HEADER_VALUE, "X-Tenant": "acme-1", **{f"X-H{n}": "v" for n in range(18)}}
    response = api.post("endpoints", {"url": "https://a.example.com/hook", "headers": headers})
    assert response.status_code == 201, response.content
    endpoint = response.json()
    assert set(endpoint["header_names"]) == set(headers) and "headers" not in endpoint
    for shown in (response.content, api.get(f"endpoints/{endpoint['id']}").content, api.get("endpoints").content):
        assert HEADER_VALUE.encode() not in shown and b"acme-1" not in shown
    assert HEADER_VALUE not in _stored_text() and "acme-1" not in _stored_text()

    # PATCH replaces the set; a bad one changes nothing; null removes them
    patched = api.patch(f"endpoints/{endpoint['id']}", {"headers": {"X-Other": "1"}})
    assert patched.status_code == 200 and patched.json()["header_names"] == ["X-Other"]
    refused = api.patch(f"endpoints/{endpoint['id']}", {"headers": {"User-Agent": "x"}, "description": "new"})
    assert refused.status_code == 400
    assert api.get(f"endpoints/{endpoint['id']}").json()["header_names"] == ["X-Other"]
    assert Endpoint.objects.get().description == ""
    cleared = api.patch(f"endpoints/{endpoint['id']}", {"headers": None})
    assert cleared.status_code == 200 and cleared.json()["header_names"] == []
    assert not EndpointAccess.objects.exists()  # nothing left: no row for the worker to read


def test_headers_and_basic_auth_reach_the_receiver_on_every_attempt(api, receiver):
    create_endpoint(api, receiver.url(), headers={"X-Api-Key": HEADER_VALUE},
                    auth={"type": "basic", "username": "herald", "password": PASSWORD})
    delivery_id = api.delivery_id("invoice.paid")
    receiver.script("/hook", 500)
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
    _due_now(delivery_id)
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    requests = receiver.wait_for(2)
    expected = "Basic " + base64.b64encode(f"herald:{PASSWORD}".encode()).decode()
    for request in requests:
        assert request.headers["x-api-key"] == HEADER_VALUE
        assert request.headers["authorization"] == expected
        assert request.headers["webhook-signature"].startswith("v1,")  # Herald's own headers are still there
        assert request.headers["content-type"] == "application/json"


def test_bearer_auth_and_headers_on_the_engine(api, receiver, engine):
    endpoint = create_endpoint(api, receiver.url(), auth={"type": "bearer", "token": BEARER},
                               headers={"X-Team": "payments"})
    assert endpoint["auth"] == {"type": "bearer"}
    ids = [api.delivery_id("invoice.paid") for _ in range(5)]
    assert engine.run(ids)
    requests = receiver.wait_for(5)
    assert {r.headers["authorization"] for r in requests} == {f"Bearer {BEARER}"}
    assert {r.headers["x-team"] for r in requests} == {"payments"}
    assert Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() == 5


def test_an_endpoint_without_access_sends_no_authorization(api, receiver):
    create_endpoint(api, receiver.url())
    assert delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) == Delivery.SUCCEEDED
    assert "authorization" not in receiver.wait_for(1)[0].headers



def test_a_change_of_headers_or_auth_takes_effect_on_the_next_attempt(api, receiver, engine):
    """A worker keeps each endpoint's decrypted access (per process, by the access row's updated_at): a change
    must reach the very next attempt, on the engine and on a task's own thread alike."""
    endpoint = create_endpoint(api, receiver.url(), headers={"X-Api-Key": "first-value"},
                               auth={"type": "bearer", "token": BEARER})
    engine.submit(api.delivery_id("invoice.paid"))
    assert engine.drain(10)
    first, = receiver.wait_for(1)
    assert (first.headers["x-api-key"], first.headers["authorization"]) == ("first-value", f"Bearer {BEARER}")

    changed = api.patch(f"endpoints/{endpoint['id']}", {
        "headers": {"X-Api-Key": "second-value", "X-More": "1"},
        "auth": {"type": "basic", "username": "herald", "password": PASSWORD}})
    assert changed.status_code == 200, changed.content
    engine.submit(api.delivery_id("invoice.paid"))
    assert engine.drain(10)
    second = receiver.wait_for(2)[1]
    assert (second.headers["x-api-key"], second.headers["x-more"]) == ("second-value", "1")
    assert second.headers["authorization"] == "Basic " + base64.b64encode(f"herald:{PASSWORD}".encode()).decode()

    assert api.patch(f"endpoints/{endpoint['id']}", {"headers": None, "auth": None}).status_code == 200
    assert delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) == Delivery.SUCCEEDED
    third = receiver.wait_for(3)[2]
    assert "x-api-key" not in third.headers and "x-more" not in third.headers
    assert "authorization" not in third.headers


def test_every_delivery_of_a_claimed_batch_carries_its_endpoints_access(api, receiver):
    """The claim reads an endpoint's access once per batch (on one of its deliveries): every delivery of the
    batch gets it all the same, and the deliveries of an endpoint without access get none."""
    guarded = create_endpoint(api, receiver.url("/guarded"), headers={"X-Api-Key": HEADER_VALUE},
                              auth={"type": "bearer", "token": BEARER})
    create_endpoint(api, receiver.url("/plain"))
    ids = []
    for n in range(3):
        ids += [d["id"] for d in api.send_event("invoice.paid", {"n": n})["deliveries"]]
    claims = deliveries_claim(delivery_ids=ids).claims
    assert sorted(claims) == sorted(ids)
    guarded_claims = [c for c in claims.values() if c.endpoint_id == guarded["id"]]
    assert len(guarded_claims) == 3
    for claim in claims.values():
        if claim.endpoint_id == guarded["id"]:
            assert claim.access.header_lines == (f"X-Api-Key: {HEADER_VALUE}",)
            assert (claim.access.auth.kind, claim.access.auth.secret) == ("bearer", BEARER)
        else:
            assert claim.access is None


def test_a_tenants_traceparent_header_gives_way_to_the_attempts_own_when_tracing():
    """A tenant may send a header named traceparent; a process that traces sends its attempt's own instead
    (never two), and one that does not sends the tenant's."""
    loaded = access.Access((("TraceParent", "00-tenant"), ("X-Api-Key", "k"), ("tracestate", "t=1")))
    assert loaded.header_lines == ("TraceParent: 00-tenant", "X-Api-Key: k", "tracestate: t=1")
    assert loaded.header_lines_traced == ("X-Api-Key: k",)


# -- auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize("auth, fragment", [
    ({"type": "digest"}, "`type`"),
    ({"username": "a", "password": "b"}, "`type`"),
    ({"type": "basic", "username": "a"}, "'password' is required"),
    ({"type": "basic", "username": "a:b", "password": "c"}, "RFC 7617"),
    ({"type": "basic", "username": "a", "password": "b", "token": "c"}, "Unknown fields"),
    ({"type": "bearer"}, "'token' is required"),
    ({"type": "bearer", "token": "two words"}, "spaces"),
    ({"type": "bearer", "token": "caf\u00e9"}, "printable ASCII"),
    ({"type": "basic", "username": "u\x01", "password": "p"}, "control characters"),
    ({"type": "oauth2_client_credentials", "token_url": "https://auth.example.com/t", "client_id": "c"},
     "'client_secret' is required"),
    ({"type": "oauth2_client_credentials", "token_url": "ftp://auth.example.com/t", "client_id": "c",
      "client_secret": "s"}, "http or https"),
    ("basic", "object"),
])
def test_bad_auth_is_refused_and_changes_nothing(api, auth, fragment):
    response = api.post("endpoints", {"url": "https://a.example.com/hook", "auth": auth})
    assert response.status_code == 400, response.content
    assert fragment in " ".join(response.json()["errors"]["auth"])
    assert not Endpoint.objects.exists()


def test_text_the_parser_may_let_through_is_refused_all_the_same():
    # The API's JSON parser refuses lone surrogates itself; the rule holds for any other caller (portal, admin).
    with pytest.raises(access.AccessRefused, match="valid Unicode"):
        access.auth_validate({"type": "basic", "username": "u", "password": "\ud800"})


def test_a_token_url_into_a_private_network_is_refused(api, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    response = api.post("endpoints", {"url": "https://93.184.216.34/hook", "auth": {
        "type": "oauth2_client_credentials", "token_url": "http://127.0.0.1:9/token", "client_id": "c",
        "client_secret": "s"}})
    assert response.status_code == 400
    assert "non-public address" in response.json()["errors"]["auth"][0]


def test_auth_is_shown_without_its_secrets(api):
    basic = create_endpoint(api, "https://a.example.com/", auth={"type": "basic", "username": "u",
                                                                  "password": PASSWORD})
    assert basic["auth"] == {"type": "basic", "username": "u"}
    oauth = create_endpoint(api, "https://b.example.com/", auth={
        "type": "oauth2_client_credentials", "token_url": "https://auth.example.com/token", "client_id": "cid",
        "client_secret": "cs-never-shown", "scope": "webhooks:write", "audience": "https://b.example.com"})
    assert oauth["auth"] == {"type": "oauth2_client_credentials", "token_url": "https://auth.example.com/token",
                             "client_id": "cid", "scope": "webhooks:write", "audience": "https://b.example.com"}
    listing = api.get("endpoints").content
    assert PASSWORD.encode() not in listing and b"cs-never-shown" not in listing
    assert PASSWORD not in _stored_text() and "cs-never-shown" not in _stored_text()
    assert api.patch(f"endpoints/{basic['id']}", {"auth": None}).json()["auth"] is None


# -- mutual TLS ---------------------------------------------------------------------------------


def _expired_certificate() -> dict:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old.example")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=30))
            .not_valid_after(now - dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    return {"certificate": cert.public_bytes(serialization.Encoding.PEM).decode(),
            "private_key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()).decode()}


def test_bad_client_certificates_are_refused(api, ca):
    good, other = _client_cert(ca), _client_cert(ca, "other.example")
    encrypted_key = serialization.load_pem_private_key(good["private_key"].encode(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")).decode()
    for value, fragment in [
        ({"certificate": "not a pem", "private_key": good["private_key"]}, "not a PEM X.509"),
        ({"certificate": good["certificate"], "private_key": "junk"}, "not a PEM private key"),
        ({"certificate": good["certificate"], "private_key": other["private_key"]}, "does not belong"),
        ({"certificate": good["certificate"], "private_key": encrypted_key}, "encrypted"),
        ({"certificate": good["certificate"]}, "{certificate, private_key}"),
        (_expired_certificate(), "expired"),
    ]:
        response = api.post("endpoints", {"url": "https://a.example.com/", "client_certificate": value})
        assert response.status_code == 400, (fragment, response.content)
        assert fragment in response.json()["errors"]["client_certificate"][0]
    assert not Endpoint.objects.exists()


def test_mutual_tls_with_the_certificate_and_not_without(api, ca, ca_bundle, engine):
    server = TlsReceiver(ca, client_ca=ca)
    try:
        endpoint = create_endpoint(api, server.url())
        refused = api.delivery_id("invoice.paid")
        assert delivery_attempt(delivery_id=refused) == Delivery.PENDING  # no certificate: the handshake fails
        assert _attempts(refused)[0].error and server.seen == []

        cert = _client_cert(ca)
        patched = api.patch(f"endpoints/{endpoint['id']}", {"client_certificate": cert})
        assert patched.status_code == 200, patched.content
        shown = patched.json()["client_certificate"]
        parsed = x509.load_pem_x509_certificate(cert["certificate"].encode())
        unit = parsed.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value
        assert shown["subject"] == f"OU={unit},O=trustme v1.2.1"
        assert dt.datetime.fromisoformat(shown["expires_at"].replace("Z", "+00:00")) == parsed.not_valid_after_utc
        assert b"PRIVATE KEY" not in patched.content and b"PRIVATE KEY" not in api.get("endpoints").content
        assert "PRIVATE KEY" not in _stored_text()

        assert delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) == Delivery.SUCCEEDED
        ids = [api.delivery_id("invoice.paid") for _ in range(3)]
        assert engine.run(ids)
        assert Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() == 3
        assert len(server.seen) == 4
        assert all(f"organizationalUnitName={unit}" in seen.client_subject for seen in server.seen)
    finally:
        server.close()


def test_a_receiver_certificate_for_another_name_fails_verification(api, ca, ca_bundle):
    server = TlsReceiver(ca, hostnames=("other.example",))
    try:
        create_endpoint(api, server.url())
        delivery_id = api.delivery_id("invoice.paid")
        assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
        assert _attempts(delivery_id)[0].error.startswith("tls_error")
    finally:
        server.close()


# -- OAuth2 client credentials ------------------------------------------------------------------


def _oauth_endpoint(api, url, token_server, **extra):
    return create_endpoint(api, url, auth={
        "type": "oauth2_client_credentials", "token_url": token_server.url, "client_id": token_server.client_id,
        "client_secret": token_server.client_secret, **extra})


def test_one_token_per_expiry_window_and_a_new_one_after_a_401(api, receiver, token_server):
    token_server.expires_in = 3
    _oauth_endpoint(api, receiver.url(), token_server, scope="webhooks:write", audience="https://rcv.example")
    assert [delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) for _ in range(3)] == [Delivery.SUCCEEDED] * 3
    assert len(token_server.requests) == 1  # reused
    request = token_server.requests[0]
    assert request.form == {"grant_type": ["client_credentials"], "scope": ["webhooks:write"],
                            "audience": ["https://rcv.example"]}
    assert request.client == (token_server.client_id, token_server.client_secret)  # HTTP Basic, RFC 6749 §2.3.1
    assert request.content_type == "application/x-www-form-urlencoded"
    assert {r.headers["authorization"] for r in receiver.wait_for(3)} == {"Bearer tok-1"}

    receiver.script("/hook", 401)  # the endpoint no longer takes tok-1
    refused = api.delivery_id("invoice.paid")
    assert delivery_attempt(delivery_id=refused) == Delivery.PENDING
    assert len(token_server.requests) == 1
    _due_now(refused)
    assert delivery_attempt(delivery_id=refused) == Delivery.SUCCEEDED
    assert len(token_server.requests) == 2
    assert receiver.received[-1].headers["authorization"] == "Bearer tok-2"

    time.sleep(3.1)  # the input: tok-2's lifetime (3 s) passes; it is dropped a tenth of it before (access.py)
    assert delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) == Delivery.SUCCEEDED
    assert len(token_server.requests) == 3
    assert receiver.received[-1].headers["authorization"] == "Bearer tok-3"


def test_concurrent_attempts_on_the_engine_share_one_token(api, receiver, token_server, engine):
    _oauth_endpoint(api, receiver.url(), token_server)
    ids = [api.delivery_id("invoice.paid") for _ in range(10)]
    assert engine.run(ids)
    assert Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() == 10
    assert len(token_server.requests) == 1
    assert {r.headers["authorization"] for r in receiver.wait_for(10)} == {"Bearer tok-1"}


def test_a_failing_token_endpoint_is_a_failed_attempt_counted_by_the_breaker(api, receiver, token_server,
                                                                             settings, engine):
    settings.WEBHOOK_BREAKER_FAILURES = 3
    endpoint = create_endpoint(api, receiver.url(), auth={
        "type": "oauth2_client_credentials", "token_url": token_server.url, "client_id": token_server.client_id,
        "client_secret": "wrong-secret"})
    first = api.delivery_id("invoice.paid")
    assert delivery_attempt(delivery_id=first) == Delivery.PENDING
    attempt = _attempts(first)[0]
    assert attempt.error.startswith("oauth2_token:") and "invalid_client" in attempt.error
    assert attempt.response_status is None
    assert Endpoint.objects.get(pk=endpoint["id"]).consecutive_failures == 1

    token_server.fail.append((500, {"oops": True}))
    second = api.delivery_id("invoice.paid")
    engine.submit(second)
    assert engine.drain(10)
    assert _attempts(second)[0].error.startswith("oauth2_token:")
    assert Endpoint.objects.get(pk=endpoint["id"]).consecutive_failures == 2

    api.patch(f"endpoints/{endpoint['id']}", {"auth": {  # a token endpoint that is not there
        "type": "oauth2_client_credentials", "token_url": f"http://127.0.0.1:{free_port()}/token",
        "client_id": "c", "client_secret": "s"}})
    third = api.delivery_id("invoice.paid")
    assert delivery_attempt(delivery_id=third) == Delivery.PENDING
    assert _attempts(third)[0].error.startswith("oauth2_token: connection_error")
    tripped = Endpoint.objects.get(pk=endpoint["id"])
    assert tripped.consecutive_failures == 3 and tripped.tripped_at is not None
    assert receiver.received == []


def test_a_slow_token_endpoint_is_bounded_by_the_attempt_deadline(api, receiver, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    import socket
    listener = socket.socket()  # accepts connections (the backlog), never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        create_endpoint(api, receiver.url(), auth={
            "type": "oauth2_client_credentials", "token_url": f"http://127.0.0.1:{listener.getsockname()[1]}/t",
            "client_id": "c", "client_secret": "s"})
        delivery_id = api.delivery_id("invoice.paid")
        started = time.monotonic()
        assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
        assert time.monotonic() - started < 2
        assert _attempts(delivery_id)[0].error.startswith("oauth2_token: timeout")
    finally:
        listener.close()


# -- never logged, rotation ---------------------------------------------------------------------


def test_secrets_are_never_logged(api, receiver, token_server, caplog, engine):
    caplog.set_level(logging.DEBUG)
    _oauth_endpoint(api, receiver.url(), token_server)
    create_endpoint(api, receiver.url("/basic"), headers={"X-Api-Key": HEADER_VALUE},
                    auth={"type": "basic", "username": "u", "password": PASSWORD})
    receiver.script("/hook", 401)
    ids = [api.delivery_id("invoice.paid") for _ in range(2)]
    assert engine.run(ids)
    for delivery_id in ids:
        delivery_attempt(delivery_id=delivery_id)
    claims = deliveries_claim(delivery_ids=ids).claims
    secrets = [HEADER_VALUE, PASSWORD, token_server.client_secret, "tok-1", "tok-2"]
    assert caplog.records
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records) + repr(claims)
    for secret in secrets:
        assert secret not in logged, secret


def test_rotation_re_encrypts_the_access_secrets(api, settings, ca):
    def key():
        out = io.StringIO()
        call_command("reencrypt_secrets", "--new-key", stdout=out)
        return out.getvalue().strip()

    old, new = key(), key()
    settings.HERALD_ENCRYPTION_KEYS = [old]
    cert = _client_cert(ca)
    create_endpoint(api, "https://a.example.com/", headers={"X-Api-Key": HEADER_VALUE},
                    auth={"type": "bearer", "token": BEARER}, client_certificate=cert)
    row = EndpointAccess.objects.get()
    columns = ("encrypted_headers", "encrypted_auth_secret", "encrypted_private_key")
    before = {column: getattr(row, column) for column in columns}
    settings.HERALD_ENCRYPTION_KEYS = [new, old]
    out = io.StringIO()
    call_command("reencrypt_secrets", stdout=out)
    assert "re-encrypted the access secrets of 1 endpoints" in out.getvalue()
    row.refresh_from_db()
    opened = {column: Fernet(new).decrypt(getattr(row, column).encode()).decode() for column in columns}
    assert all(getattr(row, column) != before[column] for column in columns)
    assert HEADER_VALUE in opened["encrypted_headers"] and opened["encrypted_auth_secret"] == BEARER
    assert opened["encrypted_private_key"] == cert["private_key"]

    settings.HERALD_ENCRYPTION_KEYS = [key()]  # a key that opens nothing: refused, nothing changed
    with pytest.raises(Exception, match="no key in HERALD_ENCRYPTION_KEYS opens"):
        call_command("reencrypt_secrets", stdout=io.StringIO())


def test_access_that_no_key_opens_is_never_sent_without_it(api, settings, receiver):
    settings.HERALD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    create_endpoint(api, receiver.url(), auth={"type": "bearer", "token": BEARER})
    delivery_id = api.delivery_id("invoice.paid")
    EndpointAccess.objects.update(encrypted_auth_secret=Fernet(Fernet.generate_key()).encrypt(b"x").decode())
    assert deliveries_claim(delivery_ids=[delivery_id]).claims == {}
    assert receiver.received == []


def test_the_admin_shows_access_without_its_secrets(api, admin_client, ca):
    cert = _client_cert(ca)
    endpoint = create_endpoint(api, "https://a.example.com/", headers={"X-Api-Key": HEADER_VALUE},
                               auth={"type": "basic", "username": "ops-visible", "password": PASSWORD},
                               client_certificate=cert)
    page = admin_client.get(f"/admin/webhooks/endpoint/{endpoint['id']}/change/").content.decode()
    assert "X-Api-Key" in page and "basic (username=ops-visible)" in page
    assert endpoint["client_certificate"]["subject"] in page
    row = EndpointAccess.objects.get()
    for hidden in (HEADER_VALUE, PASSWORD, "PRIVATE KEY", row.encrypted_headers[:16], row.encrypted_auth_secret[:16]):
        assert hidden not in page
    # an operator's save (re-enable) leaves the access as it was
    response = admin_client.post(f"/admin/webhooks/endpoint/{endpoint['id']}/change/", {
        "description": "ops", "enabled": "on", "ordering": "unordered", "secrets-TOTAL_FORMS": 1,
        "secrets-INITIAL_FORMS": 1})
    assert response.status_code == 302
    assert EndpointAccess.objects.get().encrypted_headers == row.encrypted_headers


def test_the_portal_sets_headers_auth_and_a_certificate_and_never_shows_them(api, ca):
    from tests.test_portal import _portal

    endpoint = create_endpoint(api, "https://a.example.com/hook")
    client = _portal(api)
    page = f"/portal/endpoints/{endpoint['id']}"
    form = f"{page}/access"
    refused = client.post(form, {"part": "headers", "headers": "User-Agent: evil"})
    assert refused.status_code == 400 and b"set by Herald" in refused.content
    assert client.post(form, {"part": "headers", "headers": "no colon"}).status_code == 400
    assert not EndpointAccess.objects.exists()
    assert client.post(form, {"part": "headers", "headers": f"X-Api-Key: {HEADER_VALUE}\nX-Team: a"}).status_code == 302
    assert client.post(form, {"part": "auth", "auth_type": "basic", "username": "u", "password": PASSWORD}
                       ).status_code == 302
    cert = _client_cert(ca)
    bad_cert = client.post(form, {"part": "certificate", "certificate": cert["certificate"], "private_key": "x"})
    assert bad_cert.status_code == 400 and b"not a PEM private key" in bad_cert.content
    assert client.post(form, {"part": "certificate", **cert}).status_code == 302

    shown = api.get(f"endpoints/{endpoint['id']}").json()
    assert shown["header_names"] == ["X-Api-Key", "X-Team"] and shown["auth"] == {"type": "basic", "username": "u"}
    assert shown["client_certificate"]["subject"].startswith("OU=Testing cert")
    html = client.get(page).content.decode()
    assert "X-Api-Key, X-Team" in html and "basic, username u" in html and "Testing cert" in html
    assert HEADER_VALUE not in html and PASSWORD not in html and "PRIVATE KEY" not in html

    assert client.post(form, {"part": "certificate-remove"}).status_code == 302
    assert client.post(form, {"part": "auth", "auth_type": ""}).status_code == 302
    assert client.post(form, {"part": "headers", "headers": ""}).status_code == 302
    assert not EndpointAccess.objects.exists()
    assert other_tenant_cannot(form, ca)


def other_tenant_cannot(form, ca) -> bool:
    from tests.conftest import make_api
    from tests.test_portal import _portal

    stranger = _portal(make_api("stranger"))
    return stranger.post(form, {"part": "headers", "headers": "X-A: b"}).status_code == 404 and \
        not EndpointAccess.objects.exists()
