"""Admin logins are throttled (django-axes): failed tries of one user name are counted through the real login
form, and the user name is refused once over the limit, from whatever address, as is an address that failed
as often for any names; the address recorded is the
client's behind trusted proxies only (config/proxy.py). Through real nginx and gunicorn: tests/test_behind_tls.py."""
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


def test_failed_logins_lock_the_user_name_even_with_the_right_password(operator, settings):
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
    # the user name is locked wherever the next try comes from; another user name elsewhere is not
    assert _login("right-password-123", "192.0.2.44").status_code == 429
    assert _login("wrong", "192.0.2.46", username="someone-else").status_code == 200


def test_failures_from_ever_new_addresses_still_lock_the_user_name(operator, settings):
    # what the review did from 127.0.0.1: a new X-Forwarded-For on every try, then the right password
    for n in range(settings.AXES_FAILURE_LIMIT + 3):
        _login("wrong", f"198.51.100.{n}", forwarded_for=f"203.0.113.{n}")
    assert _login("right-password-123", "198.51.100.200").status_code == 429
    assert _login("right-password-123", "127.0.0.1", forwarded_for="10.1.2.3").status_code == 429


def test_an_address_trying_many_user_names_is_locked_too(operator, settings):
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login("wrong", "198.51.100.9", username=f"guess-{n}").status_code == 200
    assert _login("wrong", "198.51.100.9", username="guess-last").status_code == 429   # the limit's failure
    # each name failed once, the address five times: the address is refused, even for the right password
    assert _login("right-password-123", "198.51.100.9").status_code == 429
    # the user name itself is not locked: from another address it logs in
    assert _login("right-password-123", "192.0.2.45").status_code == 302


def test_a_client_writing_x_forwarded_for_is_not_believed_without_trusted_proxies(operator, settings):
    assert settings.HERALD_TRUSTED_PROXIES == []  # the default: no proxy is trusted
    response = _login("wrong", "127.0.0.1", forwarded_for="203.0.113.9")
    assert response.status_code == 200
    from axes.models import AccessAttempt

    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["127.0.0.1"]


def test_behind_a_trusted_proxy_the_failures_are_recorded_for_the_client_not_the_proxy(operator, settings):
    settings.HERALD_TRUSTED_PROXIES = ["172.18.0.0/16"]
    from axes.models import AccessAttempt

    # compose's nginx appends the address it was reached from to X-Forwarded-For; what the client itself
    # wrote to the left of it is not believed
    _login("wrong", "172.18.0.5", forwarded_for="10.9.9.1, 8.8.4.4")
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["8.8.4.4"]


@pytest.mark.parametrize("trusted,peer,forwarded,client", [
    # nothing trusted (the default): the peer, whatever it is and whatever it says
    ([], "8.8.8.8", "1.1.1.1", "8.8.8.8"),
    ([], "127.0.0.1", "203.0.113.5", "127.0.0.1"),
    ([], "10.0.0.7", "10.1.2.3", "10.0.0.7"),
    ([], "172.18.0.5", None, "172.18.0.5"),
    # a peer that is not one of the trusted proxies is the client
    (["172.18.0.0/16"], "8.8.8.8", "1.1.1.1", "8.8.8.8"),
    (["172.18.0.0/16"], "10.0.0.7", "1.1.1.1", "10.0.0.7"),   # private, but not ours
    (["172.18.0.0/16"], "127.0.0.1", "1.1.1.1", "127.0.0.1"),
    # through a trusted proxy: the right-most address that is not trusted
    (["172.18.0.0/16"], "172.18.0.5", "1.1.1.1", "1.1.1.1"),
    (["172.18.0.0/16"], "172.18.0.5", "6.6.6.6, 1.1.1.1", "1.1.1.1"),
    (["172.18.0.0/16"], "172.18.0.5", "203.0.113.9, 10.1.2.3", "10.1.2.3"),  # a client on the LAN is itself
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", "1.1.1.1, 10.0.0.7", "1.1.1.1"),  # two proxies of ours
    (["127.0.0.0/8"], "127.0.0.1", "127.0.0.2, 127.0.0.1", "127.0.0.2"),  # every address trusted: the left-most
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", "1.1.1.1, garbage, 10.0.0.7", "10.0.0.7"),
    (["127.0.0.1"], "127.0.0.1", "", "127.0.0.1"),
    (["::1"], "::1", "2001:4860:4860::8888", "2001:4860:4860::8888"),
    (["172.18.0.0/16"], "::ffff:172.18.0.5", "1.1.1.1", "1.1.1.1"),   # IPv4 on a dual-stack socket
])
def test_the_client_address(settings, trusted, peer, forwarded, client):
    settings.HERALD_TRUSTED_PROXIES = trusted
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_address(RequestFactory().get("/", **extra)) == client


def test_a_bad_trusted_proxy_is_refused_at_start():
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    checked = subprocess.run([sys.executable, "-c", "import django; django.setup()"], capture_output=True, text=True,
                             env=subprocess_env(HERALD_TRUSTED_PROXIES="10.0.0.0/8,not-a-network"), timeout=60)
    assert checked.returncode != 0 and "HERALD_TRUSTED_PROXIES: 'not-a-network'" in checked.stderr
