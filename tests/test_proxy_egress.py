"""WEBHOOK_PROXY_URL (SPEC §11): attempts and token requests go through a real proxy (tinyproxy for HTTP,
microsocks for SOCKS5, Debian's packages, run by the test), which is told to connect to the address Herald
resolved and checked itself; TLS is still verified against the URL's host name."""
import contextlib
import socket

import pytest
import trustme

from tests.access_servers import Proxy, TlsReceiver, TokenServer
from tests.conftest import create_endpoint
from webhooks.models import Delivery, DeliveryAttempt
from webhooks.delivery.engine import delivery_attempt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_tokens")]

NAME = "egress.herald-test.example"


@contextlib.contextmanager
def _hosts_entry(name, address):
    """`name` resolves to `address` in this process, as an /etc/hosts line would make it: the engine runs here
    and looks its hosts up with the system's getaddrinfo (webhooks/transport.py), then has libcurl and the
    proxy connect to the address it checked, so no other resolver is asked. Every other name is looked up
    as before, and the machine's /etc/hosts is never written (two test processes share it)."""
    lookup = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        return lookup(address if host == name else host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.getaddrinfo = lookup


@pytest.fixture
def proxy(request, tmp_path, settings):
    """A proxy run for the test and set as WEBHOOK_PROXY_URL: tinyproxy ("http", unless the test passes
    "socks5" with `parametrize(..., indirect=True)`) or microsocks."""
    proxy = Proxy(getattr(request, "param", "http"), tmp_path)
    settings.WEBHOOK_PROXY_URL = proxy.url
    yield proxy
    proxy.stop()


def _error(delivery_id) -> str:
    return DeliveryAttempt.objects.get(delivery_id=delivery_id).error


@pytest.mark.parametrize("proxy, connected", [("http", "CONNECT 127.0.0.1:{port}"),
                                               ("socks5", "connected to 127.0.0.1:{port}")], indirect=["proxy"])
def test_attempts_go_through_the_proxy_to_the_checked_address(api, receiver, proxy, connected, engine):
    with _hosts_entry(NAME, "127.0.0.1"):
        create_endpoint(api, f"http://{NAME}:{receiver.port}/hook")
        assert delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) == Delivery.SUCCEEDED
        ids = [api.delivery_id("invoice.paid") for _ in range(3)]
        assert engine.run(ids)
    assert Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() == 3
    assert len(receiver.wait_for(4)) == 4
    log = proxy.log()
    # the proxy was asked for the address Herald checked, never for the name (which it would resolve itself)
    assert connected.format(port=receiver.port) in log
    assert NAME not in log


def test_tls_through_the_proxy_is_verified_against_the_url_host(api, proxy, tmp_path, settings):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    settings.WEBHOOK_CA_BUNDLE = str(tmp_path / "ca.pem")
    good = TlsReceiver(ca, hostnames=(NAME,))
    wrong = TlsReceiver(ca, hostnames=("someone-else.example",))
    try:
        with _hosts_entry(NAME, "127.0.0.1"):
            create_endpoint(api, good.url(NAME))
            create_endpoint(api, wrong.url(NAME))
            event = api.send_event("invoice.paid")
            outcomes = {d["endpoint_id"]: delivery_attempt(delivery_id=d["id"]) for d in event["deliveries"]}
        assert sorted(outcomes.values()) == [Delivery.PENDING, Delivery.SUCCEEDED]
        assert len(good.seen) == 1 and wrong.seen == []
        failed = next(d["id"] for d in event["deliveries"] if outcomes[d["endpoint_id"]] == Delivery.PENDING)
        assert _error(failed).startswith("tls_error")
        log = proxy.log()
        assert f"CONNECT 127.0.0.1:{good.port}" in log and f"CONNECT 127.0.0.1:{wrong.port}" in log
    finally:
        good.close()
        wrong.close()


def test_a_private_address_is_refused_before_the_proxy_is_asked(api, receiver, proxy, settings):
    with _hosts_entry(NAME, "127.0.0.1"):
        create_endpoint(api, f"http://{NAME}:{receiver.port}/hook")  # created while private networks are allowed
        settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
        delivery_id = api.delivery_id("invoice.paid")
        assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
    assert _error(delivery_id) == "blocked_address: 127.0.0.1 is not a public address"
    assert receiver.received == []
    assert f":{receiver.port}" not in proxy.log()  # the proxy was never asked to connect there


def test_oauth2_token_requests_go_through_the_proxy(api, receiver, proxy):
    token_server = TokenServer()
    try:
        create_endpoint(api, receiver.url(), auth={
            "type": "oauth2_client_credentials", "token_url": token_server.url,
            "client_id": token_server.client_id, "client_secret": token_server.client_secret})
        assert delivery_attempt(delivery_id=api.delivery_id("invoice.paid")) == Delivery.SUCCEEDED
        assert len(token_server.requests) == 1
        assert receiver.wait_for(1)[0].headers["authorization"] == "Bearer tok-1"
        log = proxy.log()
        assert f"CONNECT 127.0.0.1:{token_server.port}" in log and f"CONNECT 127.0.0.1:{receiver.port}" in log
    finally:
        token_server.close()
