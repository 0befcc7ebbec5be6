"""Compose's nginx front (deploy/nginx/herald.conf.template), rendered as the nginx image renders it and run by a
real nginx in front of a real gunicorn: requests, replays and Herald's errors pass through, a body over the
proxy's own limit gets the same problem+json, slow clients slow nobody. (Spreading over several `web` replicas
is Docker's DNS answering with each replica's address; it is not reproduced here.)"""
import re
import time
import uuid
from urllib.parse import urlsplit

import pytest
import requests
from requests.adapters import HTTPAdapter

from blackbox.slowclients import all_opened, body_tricklers, exchange, header_tricklers
from tests.conftest import make_api, wait_until
from testkit.local_server import LocalServer, QuietHandler
from tests.processes import free_port, gunicorn, nginx, nginx_site, render_nginx_template, run_dir
from webhooks.models import Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def api():
    return make_api("acme")


def _front(processes, web: str, **site):
    port = free_port()
    workdir = run_dir("nginx")
    nginx_site(workdir, web=web, port=port, **site)
    proxy = processes(nginx(f"include {workdir}/herald.conf;", workdir))
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _up(url), timeout=10, message="nginx answering")
    proxy.url, proxy.port = url, port
    return proxy


@pytest.fixture
def front(processes):
    """nginx on a free port in front of gunicorn (by address: there is no Docker DNS here), /admin/ and
    /metrics for 127.0.0.2 only."""
    web = processes(gunicorn(free_port(), workers=None, threads=None, HERALD_TRUSTED_PROXIES="127.0.0.1/32",
                             METRICS_TOKEN="metrics-token-for-the-test"))
    return _front(processes, web.url.removeprefix("http://"), admin_networks="127.0.0.2/32,10.0.0.0/8")


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code in (200, 503)
    except requests.RequestException:
        return False


def test_the_rendered_template_keeps_nginx_variables_and_fills_ours():
    site = render_nginx_template(HERALD_WEB="web:8000", DNS_RESOLVER="127.0.0.11", PROXY_PORT="8000",
                                 HERALD_PUBLIC_URL="",
                                 HERALD_ADMIN_NETWORKS_FILE="/etc/nginx/herald-admin-networks.conf")
    assert "resolver 127.0.0.11 valid=5s" in site and "listen 8000;" in site
    assert "set $herald_web http://web:8000;" in site and "proxy_pass $herald_web;" in site
    assert "$proxy_add_x_forwarded_for" in site and "${" not in site


def test_requests_pass_through_the_proxy_with_their_answers(front, api):
    headers = {"Authorization": f"Bearer {api.token}", "Idempotency-Key": f"proxy-{uuid.uuid4()}"}
    posted = requests.post(f"{front.url}/api/v1/events", json={"type": "invoice.paid", "data": {}}, headers=headers,
                           timeout=10)
    assert posted.status_code == 202 and posted.json()["id"] == Event.objects.get().id
    replayed = requests.post(f"{front.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                             headers=headers, timeout=10)
    assert replayed.headers["Idempotent-Replay"] == "true" and replayed.content == posted.content
    # a body between Herald's limit (256 KiB) and the proxy's (1 MiB) gets Herald's own 413, every time:
    # Herald refuses it from its head while nginx is still sending the body, and takes (drops) the rest
    # before closing; a close with unread bytes resets the connection and nginx answered 502 instead
    for n in range(8):
        big = requests.post(f"{front.url}/api/v1/events", data=b"{" + b" " * 300_000 + b"}", timeout=10,
                            headers={**headers, "Content-Type": "application/json", "Idempotency-Key": f"proxy-big-{n:04}"})
        assert big.status_code == 413 and big.json()["code"] == "payload_too_large"
    # and one over the proxy's limit is refused by nginx, in the same problem+json
    huge = exchange("127.0.0.1", front.port, b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                             b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n")
    assert huge.status == 413 and huge.seconds < 1.0
    assert b"application/problem+json" in huge.head and b'"code":"payload_too_large"' in huge.head
    assert Event.objects.count() == 1


def test_slow_clients_at_the_proxy_do_not_slow_anyone(front, api):
    tricklers = header_tricklers("127.0.0.1", front.port, 50, 0.5) + body_tricklers("127.0.0.1", front.port, 50, 0.5)
    for trickler in tricklers:
        trickler.start()
    all_opened(tricklers)   # every connection has sent its first bytes
    took = []
    for n in range(20):
        started = time.monotonic()
        response = requests.post(f"{front.url}/api/v1/events", json={"type": "invoice.paid", "data": {"n": n}},
                                 timeout=5, headers={"Authorization": f"Bearer {api.token}",
                                                     "Idempotency-Key": f"proxy-slow-{n:04d}"})
        assert response.status_code == 202
        took.append(time.monotonic() - started)
    for trickler in tricklers:
        trickler.stop()
    assert max(took) < 1.0, took


def test_the_portal_works_through_the_proxy_on_plain_http(front, api):
    """Compose as it starts locally (no HERALD_PUBLIC_URL): the browser's Origin names the proxy's port, and
    the Host the proxy passes on must too, or Django's CSRF check refuses every form (it did)."""
    session = requests.Session()
    session.trust_env = False
    link = api.post("portal-links").json()["url"]
    page = session.get(front.url + urlsplit(link).path, timeout=10)
    assert page.status_code == 200
    (token,) = re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    opened = session.post(page.url, data={"csrfmiddlewaretoken": token}, allow_redirects=False, timeout=10,
                          headers={"Origin": front.url, "Referer": page.url})
    assert opened.status_code == 302 and opened.headers["Location"] == "/portal/", opened.text[:300]
    assert session.get(f"{front.url}/portal/", timeout=10).status_code == 200


class _From(HTTPAdapter):
    """Connections from a given loopback address (127.0.0.2 is another client than 127.0.0.1)."""

    def __init__(self, address: str, **kwargs):
        self._address = address
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self._address, 0)
        super().init_poolmanager(*args, **kwargs)


def _client(address: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", _From(address))
    return session


def test_admin_and_metrics_answer_only_to_the_admin_networks(front):
    outsider, operator = _client("127.0.0.1"), _client("127.0.0.2")
    metrics = {"Authorization": "Bearer metrics-token-for-the-test"}
    # the API, the portal and /healthz are for everyone
    for client in (outsider, operator):
        assert client.get(f"{front.url}/healthz", timeout=10).status_code in (200, 503)
        assert client.get(f"{front.url}/api/v1/endpoints", timeout=10).status_code == 401
        assert client.get(f"{front.url}/portal/open/no-such-link", timeout=10).status_code == 410
    assert operator.get(f"{front.url}/admin/login/", timeout=10).status_code == 200
    assert operator.get(f"{front.url}/metrics", headers=metrics, timeout=10).status_code == 200
    # the operator's surfaces, however the path is spelled, are refused by nginx to everyone else
    for path in ("/admin/", "/admin/login/", "/admin", "/%61dmin/login/", "//admin/login/", "/admin/../admin/",
                 "/metrics", "/metrics?x=1", "/%6detrics", "/metrics/"):
        answer = outsider.get(f"{front.url}{path}", headers=metrics, timeout=10, allow_redirects=False)
        assert answer.status_code == 403 and "Herald" not in answer.text, (path, answer.status_code)


def test_by_default_nobody_reaches_admin_or_metrics(processes):
    web = processes(gunicorn(free_port(), workers=1, threads=1))
    proxy = _front(processes, web.url.removeprefix("http://"))
    for address in ("127.0.0.1", "127.0.0.2"):
        client = _client(address)
        assert client.get(f"{proxy.url}/admin/login/", timeout=10).status_code == 403
        assert client.get(f"{proxy.url}/metrics", timeout=10).status_code == 403
        assert client.get(f"{proxy.url}/healthz", timeout=10).status_code in (200, 503)


@pytest.fixture
def upstream():
    """A stand-in for `web` that records the forwarding headers nginx sends it."""
    seen = []

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            seen.append({name.lower(): value for name, value in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = LocalServer(Handler)
    server.seen = seen
    yield server
    server.close()


@pytest.mark.parametrize("public_url,proto", [("", "http"), ("http://hooks.example.com", "http"),
                                              ("https://hooks.example.com", "https")])
def test_x_forwarded_proto_is_nginxs_own_never_the_clients(processes, upstream, public_url, proto):
    proxy = _front(processes, f"127.0.0.1:{upstream.port}", public_url=public_url)
    upstream.seen.clear()
    for claimed in (None, "https", "http", "gopher"):
        headers = {"X-Forwarded-Proto": claimed} if claimed else {}
        assert _client("127.0.0.2").get(f"{proxy.url}/healthz", headers={**headers, "X-Forwarded-For": "6.6.6.6"},
                                        timeout=10).status_code == 200
    assert [seen["x-forwarded-proto"] for seen in upstream.seen] == [proto] * 4
    # and the address nginx was reached from is appended to what the client wrote (which Herald believes only
    # to the right of its trusted proxies: config/proxy.py)
    assert {seen["x-forwarded-for"] for seen in upstream.seen} == {"6.6.6.6, 127.0.0.2"}
