"""Admin logins are throttled (django-axes): failed tries of one user name from one address are counted
through the real login form, the pair is refused once over the limit, and the address is the client's
behind proxies (config/proxy.py). Through real nginx and gunicorn: tests/test_behind_tls.py."""
import pytest
from django.contrib.auth.models import User
from django.test import Client, RequestFactory

from config.proxy import client_address

pytestmark = pytest.mark.django_db(transaction=True)

LOGIN = "/admin/login/?next=/admin/"


def _login(password: str, address: str, username: str = "ops", forwarded_for: str | None = None):
    """One login POST as a browser sends it: the form's page first (its CSRF cookie and token), then the form."""
    client = Client(enforce_csrf_checks=True, REMOTE_ADDR=address)
    page = client.get(LOGIN)
    assert page.status_code == 200
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/",
                               "csrfmiddlewaretoken": str(page.context["csrf_token"])}, headers=headers)


@pytest.fixture
def operator():
    return User.objects.create_superuser("ops", "ops@example.com", "right-password-123")


def test_failed_logins_lock_the_user_at_that_address_even_with_the_right_password(operator, settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        wrong = _login("wrong", "198.51.100.7")
        assert wrong.status_code == 200 and b"Please enter the correct username and password" in wrong.content
    assert _login("right-password-123", "198.51.100.7").status_code == 302  # not yet over: a success clears
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login("wrong", "198.51.100.7")
    locked = _login("right-password-123", "198.51.100.7")
    assert locked.status_code == 429 and b"too many login attempts" in locked.content
    assert "_auth_user_id" not in locked.wsgi_request.session
    # the same person elsewhere, and another user name at that address, are not locked
    assert _login("right-password-123", "192.0.2.44").status_code == 302
    assert _login("wrong", "198.51.100.7", username="someone-else").status_code == 200


def test_behind_a_proxy_the_failures_count_against_the_client_not_the_proxy(operator, settings):
    # compose's nginx (a private address) appends the address it was reached from to X-Forwarded-For;
    # what the client itself wrote to the left of it is not believed
    for n in range(settings.AXES_FAILURE_LIMIT):
        _login("wrong", "172.18.0.5", forwarded_for=f"10.9.9.{n}, 8.8.4.4")
    assert _login("right-password-123", "172.18.0.5", forwarded_for="8.8.4.4").status_code == 429
    assert _login("right-password-123", "172.18.0.5", forwarded_for="9.9.9.9").status_code == 302


@pytest.mark.parametrize("peer,forwarded,client", [
    ("8.8.8.8", None, "8.8.8.8"),
    ("8.8.8.8", "1.1.1.1", "8.8.8.8"),                  # a public peer is the client: its header is its own say
    ("172.18.0.5", "1.1.1.1", "1.1.1.1"),               # through our proxy
    ("172.18.0.5", "6.6.6.6, 1.1.1.1", "1.1.1.1"),      # what the client wrote to the left is not believed
    ("127.0.0.1", "1.1.1.1, 10.0.0.7", "1.1.1.1"),      # two proxies of ours
    ("127.0.0.1", "127.0.0.2, 127.0.0.1", "127.0.0.2"),  # everything local: the left-most
    ("127.0.0.1", "1.1.1.1, garbage, 10.0.0.7", "10.0.0.7"),
    ("127.0.0.1", "", "127.0.0.1"),
    ("::1", "2001:4860:4860::8888", "2001:4860:4860::8888"),
])
def test_the_client_address(peer, forwarded, client):
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_address(RequestFactory().get("/", **extra)) == client
