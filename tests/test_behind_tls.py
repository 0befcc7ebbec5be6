"""Herald behind TLS, as deployed: a real nginx terminates TLS (a throwaway certificate from trustme) in front
of compose's proxy configuration (deploy/nginx/herald.conf.template), in front of a real gunicorn started with
HERALD_PUBLIC_URL=https://…. A person opens a portal link, presses Continue, walks the pages and submits a
form; an operator signs in to the admin; every cookie is Secure and every answer carries HSTS; failed admin
logins are recorded with the client's address, not the proxy's; and no log line holds a portal link's token."""
import re
import uuid

import pytest
import requests
import trustme
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from requests.adapters import HTTPAdapter

from tests.conftest import make_api, wait_until
from tests.processes import free_port, gunicorn, nginx, nginx_site, run_dir
from webhooks.models import Endpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


class FromAddress(HTTPAdapter):
    """Connect from a given loopback address, so that the proxies see distinct clients."""

    def __init__(self, address: str, **kwargs):
        self.address = address
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


@pytest.fixture
def site(processes, tmp_path):
    """https://localhost:<port>: nginx terminating TLS -> compose's proxy (nginx) -> gunicorn."""
    ca = trustme.CA()
    certificate = ca.issue_cert("localhost", "127.0.0.1")
    workdir = run_dir("nginx-tls")
    certificate.private_key_and_cert_chain_pem.write_to_path(str(workdir / "site.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    tls_port, proxy_port = free_port(), free_port()
    public_url = f"https://localhost:{tls_port}"
    web = processes(gunicorn(free_port(), workers=1, threads=4, args=("--access-logfile", "-"),
                             HERALD_PUBLIC_URL=public_url, HERALD_TRUSTED_PROXIES="127.0.0.1/32"))
    # the operator's surfaces for the TLS proxy in front (the address compose's nginx is reached from)
    nginx_site(workdir, web=web.url.removeprefix("http://"), port=proxy_port, public_url=public_url,
               admin_networks="127.0.0.1/32")
    # what a load balancer in front of compose does: TLS ends here, the scheme and client go on in headers
    front = processes(nginx(f"""
    include {workdir}/herald.conf;
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        ssl_certificate {workdir}/site.pem;
        ssl_certificate_key {workdir}/site.pem;
        access_log off;
        location / {{
            proxy_pass http://127.0.0.1:{proxy_port};
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-Proto https;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
""", workdir))
    ca_path = str(tmp_path / "ca.pem")

    def up() -> bool:
        try:
            return requests.get(f"{public_url}/healthz", verify=ca_path, timeout=2).status_code in (200, 503)
        except requests.RequestException:
            return False

    wait_until(up, timeout=15, message="https through both proxies")

    class Site:
        url = public_url
        ca = ca_path
        web_log = staticmethod(web.output)
        proxy_log = staticmethod(front.output)

        @staticmethod
        def browser(address: str = "127.0.0.1") -> requests.Session:
            session = requests.Session()
            session.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would win over `verify`
            session.verify = ca_path
            session.mount("https://", FromAddress(address))
            return session

    return Site


def _form_post(browser: requests.Session, page: requests.Response, url: str, data: dict, origin: str):
    """Submit a form of `page` as a browser does: its CSRF token, with Origin and Referer."""
    (token,) = set(CSRF_FIELD.findall(page.text))
    return browser.post(url, data={"csrfmiddlewaretoken": token, **data}, allow_redirects=False,
                        headers={"Origin": origin, "Referer": page.url})


def _assert_https_answer(response: requests.Response) -> None:
    assert response.headers["Strict-Transport-Security"] == "max-age=31536000", response.url
    for cookie in response.raw.headers.getlist("Set-Cookie"):
        assert re.search(r";\s*Secure", cookie, re.I), cookie


def test_a_portal_link_opens_and_its_forms_work_over_https_with_secure_cookies(site):
    api = make_api("acme")
    made = requests.post(f"{site.url}/api/v1/portal-links", verify=site.ca, timeout=10, headers={
        "Authorization": f"Bearer {api.token}", "Idempotency-Key": f"tls-{uuid.uuid4()}"})
    assert made.status_code == 201, made.text
    link = made.json()["url"]
    assert link.startswith(f"{site.url}/portal/open/"), link
    token = link.rsplit("/", 1)[1]

    with pytest.raises(requests.exceptions.SSLError):  # real TLS: without the throwaway CA, refused
        requests.get(link, timeout=5)
    browser = site.browser()
    # a wrong method and a form without its CSRF cookie are refused (and logged) while the link still works
    assert browser.options(link).status_code == 405
    assert requests.post(link, verify=site.ca, timeout=10).status_code == 403
    shown = browser.get(link)
    assert shown.status_code == 200 and 'id="continue"' in shown.text
    _assert_https_answer(shown)
    opened = _form_post(browser, shown, link, {}, site.url)
    assert opened.status_code == 302 and opened.headers["Location"] == "/portal/", opened.text[:500]
    _assert_https_answer(opened)
    session_cookie = [c for c in opened.raw.headers.getlist("Set-Cookie") if c.startswith("sessionid=")]
    assert session_cookie and re.search(r"HttpOnly", session_cookie[0], re.I)

    for path in ("/portal/", "/portal/events", "/portal/deliveries"):
        page = browser.get(f"{site.url}{path}", allow_redirects=False)
        assert page.status_code == 200, (path, page.text[:300])
        _assert_https_answer(page)
    form = browser.get(f"{site.url}/portal/endpoints/new")
    assert form.status_code == 200
    created = _form_post(browser, form, form.url, {"url": "https://hooks.example.com/in", "ordering": "unordered"},
                         site.url)
    assert created.status_code == 302, created.text[:500]
    _assert_https_answer(created)
    endpoint = Endpoint.objects.get(tenant=api.tenant)
    assert endpoint.url == "https://hooks.example.com/in"
    assert created.headers["Location"] == f"/portal/endpoints/{endpoint.pk}"

    # no log line holds the token: gunicorn's access log, Django's warnings (405, CSRF), nginx's access log
    wait_until(lambda: "/portal/open/*** " in site.proxy_log(), timeout=5, message="nginx logging the link")
    web_log, proxy_log = site.web_log(), site.proxy_log()
    assert token not in web_log and token not in proxy_log
    for request in ('"OPTIONS /portal/open/*** HTTP/1.', '"GET /portal/open/*** HTTP/1.', '"POST /portal/open/*** HTTP/1.'):
        assert request in web_log and request in proxy_log, (request, web_log[-2000:], proxy_log[-2000:])
    assert "Method Not Allowed (OPTIONS): /portal/open/***" in web_log
    assert re.search(r"Forbidden \([^)]+\): /portal/open/\*\*\*", web_log)  # (no Referer, over https)
    assert '"https://localhost:' in proxy_log and '/portal/open/***"' in proxy_log  # the Referer of /portal/


def test_the_admin_signs_in_over_https_and_records_failures_with_the_client_address(site, settings):
    User.objects.create_superuser("ops", "ops@example.com", "right-password-123")
    login = f"{site.url}/admin/login/?next=/admin/"

    def sign_in(password: str, address: str) -> requests.Response:
        browser = site.browser(address)
        page = browser.get(login)
        assert page.status_code == 200
        _assert_https_answer(page)
        answer = _form_post(browser, page, login, {"username": "ops", "password": password, "next": "/admin/"},
                            site.url)
        answer.browser = browser
        return answer

    signed_in = sign_in("right-password-123", "127.0.0.1")
    assert signed_in.status_code == 302 and signed_in.headers["Location"] == "/admin/", signed_in.text[:500]
    _assert_https_answer(signed_in)
    home = signed_in.browser.get(f"{site.url}/admin/")
    assert home.status_code == 200 and "Herald administration" in home.text

    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert sign_in("wrong", "127.0.0.2").status_code == 200
    assert sign_in("wrong", "127.0.0.2").status_code == 429  # the one that reaches the limit
    assert sign_in("right-password-123", "127.0.0.2").status_code == 429
    # every request reached gunicorn from the proxy's address (trusted): the client's own is what was recorded
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"127.0.0.2"}
    # and the user name is locked wherever the next try comes from
    assert sign_in("right-password-123", "127.0.0.3").status_code == 429

