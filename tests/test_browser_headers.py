"""The portal's and the admin's pages tell the browser not to store them and give a strict Content Security
Policy (config/browser_headers.py); the CSRF token is a new one once a portal link is redeemed. Through
Django's test client against real PostgreSQL; tests/test_portal_browser.py and test_admin_browser.py drive
the same pages in Chromium, which enforces the policy."""
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from config.browser_headers import content_security_policy
from tests.conftest import create_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


class _Inline(HTMLParser):
    """What a page carries inline: <style> and <script> elements (with their nonce and src), style attributes
    and event handler attributes."""

    def __init__(self):
        super().__init__()
        self.styles, self.scripts, self.attributes = [], [], []

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "style":
            self.styles.append(values.get("nonce"))
        if tag == "script":
            self.scripts.append(values.get("src"))
        self.attributes += [name for name, _ in attrs if name == "style" or name.startswith("on")]


def _policy(response) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    return {part.split(" ", 1)[0]: part.split(" ", 1)[1] if " " in part else "" for part in header.split("; ")}


def _assert_strict(response, *, inline_checked: bool = True) -> None:
    assert response["Cache-Control"] == "no-store" or "no-store" in response["Cache-Control"].split(", ")
    policy = _policy(response)
    assert policy["frame-ancestors"] == "'none'" and policy["default-src"] == "'none'"
    assert policy["script-src"] == "'self'" and policy["form-action"] == "'self'" and policy["base-uri"] == "'none'"
    assert "unsafe" not in response["Content-Security-Policy"]
    if inline_checked and b"<html" in response.content:
        page = _Inline()
        page.feed(response.content.decode())
        (nonce,) = {n for n in policy["style-src"].split() if n.startswith("'nonce-")} or {None}
        assert nonce, policy
        assert page.styles and all(f"'nonce-{n}'" == nonce for n in page.styles), (page.styles, nonce)
        assert page.scripts == [] and page.attributes == [], (page.scripts, page.attributes)


def test_every_portal_page_is_not_stored_and_has_a_strict_policy(api):
    endpoint = create_endpoint(api, "https://a.example.com/hook?token=t")
    assert api.post("events", {"type": "invoice.paid", "data": {}}).status_code == 202
    path = urlsplit(api.post("portal-links").json()["url"]).path
    client = Client()
    shown = client.get(path)
    assert shown.status_code == 200
    _assert_strict(shown)
    opened = client.post(path, {"csrfmiddlewaretoken": str(shown.context["csrf_token"])})
    assert opened.status_code == 302
    _assert_strict(opened)
    delivery = api.get("deliveries").json()["data"][0]
    values = {"endpoint_id": endpoint["id"], "delivery_id": delivery["id"], "event_id": delivery["event_id"],
              "recovery_id": "rec_nothing", "token": "used-or-not"}
    # every page of the portal (config's URLs: POST-only ones answer 405), as its session sees it
    from django.urls import reverse

    from portal.urls import app_name, urlpatterns

    for pattern in urlpatterns:
        page = reverse(f"{app_name}:{pattern.name}", kwargs={name: values[name] for name in pattern.pattern.converters})
        response = client.get(page)
        assert response.status_code in (200, 404, 405, 410), (page, response.status_code)
        _assert_strict(response)
    # a used link, and a session that has ended, are pages of the portal too
    _assert_strict(Client().get(path))
    _assert_strict(Client().get("/portal/"))
    # the nonce is new on every page
    assert _policy(client.get("/portal/"))["style-src"] != _policy(client.get("/portal/"))["style-src"]


def test_admin_pages_are_not_stored_and_have_a_strict_policy(api):
    User.objects.create_superuser("ops", "ops@example.com", "right-password-123")
    client = Client()
    login = client.get("/admin/login/?next=/admin/")
    _assert_strict(login, inline_checked=False)  # Django's own templates: a change list may carry a <style>
    assert client.post("/admin/login/?next=/admin/", {"username": "ops", "password": "right-password-123",
                                                      "next": "/admin/"}).status_code == 302
    for page in ["/admin/", "/admin/webhooks/endpoint/", "/admin/webhooks/tenant/"]:
        response = client.get(page)
        assert response.status_code == 200
        _assert_strict(response, inline_checked=False)
        assert "'nonce-" in _policy(response)["style-src"] and "'self'" in _policy(response)["style-src"]
        scripts = _Inline()
        scripts.feed(response.content.decode())
        assert None not in scripts.scripts  # every script of the admin's is a file: script-src 'self' holds


def test_the_api_gets_neither_header(api):
    response = api.get("endpoints")
    assert response.status_code == 200
    assert "Content-Security-Policy" not in response and "no-store" not in response.get("Cache-Control", "")


def test_redeeming_a_link_rotates_the_csrf_token(api):
    path = urlsplit(api.post("portal-links").json()["url"]).path
    client = Client(enforce_csrf_checks=True)
    shown = client.get(path)
    before = client.cookies[settings.CSRF_COOKIE_NAME].value
    opened = client.post(path, {"csrfmiddlewaretoken": str(shown.context["csrf_token"])})
    assert opened.status_code == 302
    after = client.cookies[settings.CSRF_COOKIE_NAME].value
    assert after != before
    # the form token of the page before the link no longer passes; the new page's does
    page = client.get("/portal/endpoints/new")
    stale = client.post("/portal/endpoints/new", {"csrfmiddlewaretoken": before, "url": "https://x.example.com/"})
    assert stale.status_code == 403
    fresh = client.post("/portal/endpoints/new", {"csrfmiddlewaretoken": str(page.context["csrf_token"]),
                                                  "url": "https://x.example.com/"})
    assert fresh.status_code in (200, 302)


def test_a_directive_cannot_smuggle_another():
    assert content_security_policy({"default-src": "'none'", "frame-ancestors": "'none'"}) == \
        "default-src 'none'; frame-ancestors 'none'"
    for bad in ({"img-src": "'self'; script-src *"}, {"img-src": "a,b"}, {"img-src": "x\r\nSet-Cookie: a"}):
        with pytest.raises(ValueError):
            content_security_policy(bad)
