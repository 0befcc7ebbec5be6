"""Endpoint access (SPEC §11) between tenants, with a real Celery worker: one tenant's hanging OAuth2 token
server holds back no other tenant's attempts, and what a worker keeps of an endpoint's secrets (its access,
its OAuth2 token) goes when the endpoint or its tenant is deleted."""
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from intake.tenants import tenant_delete
from tests.access_servers import TokenServer
from tests.conftest import create_endpoint, wait_until
from tests.processes import celery_worker
from webhooks import crypto
from webhooks.delivery.destinations import access
from webhooks.delivery import signing
from webhooks.delivery.claim import delivery_claim
from webhooks.models import Delivery, DeliveryAttempt, DeliveryLease, DeliveryOutbox, Tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_tokens")]


class HangingServer:
    """Accepts connections and never answers (a token server that hangs); counts the connections."""

    def __init__(self):
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/oauth/token"
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1

    def close(self):
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def token_server():
    server = TokenServer()
    yield server
    server.close()


@pytest.fixture
def hanging():
    server = HangingServer()
    yield server
    server.close()


def _oauth2(token_url: str, client_id: str, client_secret: str) -> dict:
    return {"type": "oauth2_client_credentials", "token_url": token_url, "client_id": client_id,
            "client_secret": client_secret}


def test_a_tenant_whose_token_server_hangs_holds_back_no_other_tenants_attempts(api, other_api, receiver, hanging,
                                                                                token_server, processes):
    # given one worker, and a tenant with 64 endpoints whose token server (one client id each) never answers
    processes(celery_worker("prepare", concurrency=100))
    for n in range(64):
        create_endpoint(api, receiver.url(f"/a{n}"), auth=_oauth2(hanging.url, f"client-{n}", "s"))
    create_endpoint(other_api, receiver.url("/b"), auth=_oauth2(token_server.url, token_server.client_id,
                                                                token_server.client_secret))
    api.send_event("invoice.paid")  # 64 attempts, each waiting for a token
    wait_until(lambda: hanging.accepted >= 4, timeout=20, message="the hanging tenant's token requests")

    # when another tenant's event comes while they wait
    posted = time.monotonic()
    delivery_id = other_api.delivery_id("invoice.paid")

    # then its attempt gets its token and is delivered within its normal time (WEBHOOK_TIMEOUT_SECONDS is 2 s)
    wait_until(lambda: DeliveryAttempt.objects.filter(delivery_id=delivery_id).exists(), timeout=30,
               message="the other tenant's attempt")
    attempt = DeliveryAttempt.objects.get(delivery_id=delivery_id)
    assert (attempt.error, attempt.response_status) == ("", 200)
    received = receiver.wait_for(1, "/b")[0]
    assert received.headers["authorization"] == "Bearer tok-1"
    assert received.at - posted < 1.5, f"delivered {received.at - posted:.2f}s after it was posted"
    assert Delivery.objects.get(pk=delivery_id).status == Delivery.SUCCEEDED


@pytest.mark.parametrize("deleted", ["endpoint", "tenant"])
def test_a_deleted_endpoints_token_is_never_sent_again(api, other_api, receiver, token_server, processes, deleted):
    """The worker fetched a token for an endpoint; the endpoint (or its whole tenant) is deleted, and an
    endpoint with the same OAuth2 client is made (by the same tenant, or by another one after the first
    was deleted): the worker asks for a token of its own, it never sends the deleted one's."""
    processes(celery_worker("forget", concurrency=10))
    auth = _oauth2(token_server.url, token_server.client_id, token_server.client_secret)
    first = create_endpoint(api, receiver.url("/first"), auth=auth)
    delivered = api.delivery_id("invoice.paid")
    wait_until(lambda: Delivery.objects.get(pk=delivered).status == Delivery.SUCCEEDED, message="the first delivery")
    assert receiver.wait_for(1, "/first")[0].headers["authorization"] == "Bearer tok-1"

    if deleted == "endpoint":
        assert api.delete(f"endpoints/{first['id']}").status_code == 204
        caller = api
    else:
        tenant_delete(tenant=Tenant.objects.get(pk=api.tenant.pk))
        caller = other_api
    create_endpoint(caller, receiver.url("/second"), auth=auth)
    again = caller.delivery_id("invoice.paid")
    wait_until(lambda: Delivery.objects.get(pk=again).status == Delivery.SUCCEEDED, message="the second delivery")
    assert receiver.wait_for(1, "/second")[0].headers["authorization"] == "Bearer tok-2"
    assert len(token_server.requests) == 2


def test_a_claim_drops_the_decrypted_access_of_deleted_endpoints(api, other_api, receiver):
    """In this process (what a worker's claim does): the decrypted headers and auth of an endpoint are gone
    from its caches once the endpoint, or its tenant, is deleted, at the next claim of another endpoint."""
    secret_header, password = "hv-gone-after-delete", "pw-gone-after-delete"
    doomed = create_endpoint(api, receiver.url("/doomed"), headers={"X-Api-Key": secret_header},
                             auth={"type": "basic", "username": "u", "password": password}, signature="v1a")
    other = create_endpoint(other_api, receiver.url("/other"), headers={"X-Other": "kept"})
    claim = delivery_claim(delivery_id=api.delivery_id("invoice.paid"))
    assert claim.access.headers == (("X-Api-Key", secret_header),)
    signing.forget()  # what earlier tests of this process loaded
    signing.sign(secret=claim.secrets[0], msg_id="msg_1", timestamp=1, body=b"{}")  # its ed25519 key, loaded
    assert signing._private_key.cache_info().currsize == 1

    def held() -> str:
        return " ".join(repr((a.headers, a.auth and a.auth.secret)) for a in access._loaded.values())

    assert secret_header in held() and password in held()
    tenant_delete(tenant=Tenant.objects.get(pk=api.tenant.pk))
    assert delivery_claim(delivery_id=other_api.delivery_id("invoice.paid")).access.headers == (("X-Other", "kept"),)
    assert secret_header not in held() and password not in held()
    assert [key for key in access._loaded if key[0] == doomed["id"]] == []
    assert crypto._decrypt.cache_info().currsize <= 2  # the live endpoint's own (its signing secret, its headers)
    assert signing._private_key.cache_info().currsize == 0  # the deleted endpoint's private key too
    assert other["id"] in {key[0] for key in access._loaded}


def test_a_tenant_holds_at_most_its_share_of_the_prepare_threads_and_waits_without_failing(api, hanging, receiver,
                                                                                           settings, engine):
    """On an engine (in this process, to count exactly): a tenant's attempts that need a token take at most
    PREPARE_PER_TENANT threads at once; the others wait their turn, and one that waited so long that its
    lease would run out before its deadline is given up without an attempt (beat sends it again later)."""
    from webhooks.delivery.engine import PREPARE_PER_TENANT

    settings.WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.WEBHOOK_LEASE_SECONDS = 1.5
    for n in range(2 * PREPARE_PER_TENANT):
        create_endpoint(api, receiver.url(f"/s{n}"), auth=_oauth2(hanging.url, f"client-{n}", "s"))
    ids = [d["id"] for d in api.send_event("invoice.paid")["deliveries"]]
    assert engine.run(ids, timeout=10)
    attempts = list(DeliveryAttempt.objects.filter(delivery_id__in=ids))
    # the first share fetched (and timed out after the whole deadline); the rest never asked for a token
    assert hanging.accepted == PREPARE_PER_TENANT
    assert len(attempts) == PREPARE_PER_TENANT
    assert all(a.error.startswith("oauth2_token: timeout") and a.duration_ms >= 900 for a in attempts)
    waited = Delivery.objects.filter(pk__in=ids, attempt_count=0)
    assert waited.count() == PREPARE_PER_TENANT and {d.status for d in waited} == {Delivery.PENDING}


def test_a_tenants_claims_past_its_waiting_share_are_handed_back_to_the_outbox(api, hanging, receiver, settings,
                                                                                engine):
    """On an engine: past the PREPARE_PER_TENANT attempts being prepared and the DEFERRED_PER_TENANT waiting their
    turn, a tenant's further claims are handed back at once, not held: no lease, no attempt, no retry step, and an
    unpublished outbox row due HAND_BACK_SECONDS later, which a relay publishes again in the tenant's fair share."""
    from webhooks.delivery.engine import DEFERRED_PER_TENANT, HAND_BACK_SECONDS, PREPARE_PER_TENANT

    settings.WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.WEBHOOK_LEASE_SECONDS = 1.5
    extra = 3
    for n in range(PREPARE_PER_TENANT + DEFERRED_PER_TENANT + extra):
        create_endpoint(api, receiver.url(f"/s{n}"), auth=_oauth2(hanging.url, f"client-{n}", "s"))
    ids = [d["id"] for d in api.send_event("invoice.paid")["deliveries"]]
    DeliveryOutbox.objects.filter(delivery_id__in=ids).delete()  # as a claim leaves them (no relay runs here)
    before = timezone.now()
    assert engine.run(ids, timeout=10)
    # (the attempted ones have rows too: their retries, which their records wrote)
    back = DeliveryOutbox.objects.filter(delivery_id__in=ids, delivery__attempt_count=0)
    assert back.count() == extra
    assert all(row.published_at is None and row.tenant_id == api.tenant.pk for row in back)
    assert all(row.due_at >= before + timedelta(seconds=HAND_BACK_SECONDS - 0.5) for row in back)
    handed = {row.delivery_id for row in back}
    assert not DeliveryLease.objects.filter(delivery_id__in=handed).exists()
    assert {(d.status, d.attempt_count) for d in Delivery.objects.filter(pk__in=handed)} == {(Delivery.PENDING, 0)}
    # the share was prepared (and timed out on the hanging token server); the waiting ones were given up unattempted
    assert hanging.accepted == PREPARE_PER_TENANT
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == PREPARE_PER_TENANT
    assert Delivery.objects.filter(pk__in=ids, attempt_count=0).count() == DEFERRED_PER_TENANT + extra
